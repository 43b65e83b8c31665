"""Models against Hugging Face transformers: tiny fixtures built by tools/make_fixtures.py.

Each family runs inside the engine (paged pools, chunked prefill, prefix cache, eviction after
every decode step) and must reproduce transformers' float32 logits of a 24-token prompt to 1e-4
relative, and its greedy 8-token continuation exactly.
"""

import functools
import json
import shutil

import numpy as np
import pytest
from helpers import FIXTURES, ROOT, TOLERANCE

from swajax import sizing
from swajax.api import engine_for
from swajax.config import ConfigError
from swajax.models import HybridLM, LoadError, load_decoder, save_orbax
from swajax.models.layer_stack import LayerStack
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams

FAMILIES = ["gpt_oss", "mimo_v2_flash", "llama4", "gemma3", "qwen3", "mistral"]
# Further families and the quantized forms the hub ships a family in (tools/make_fixtures.py).
FORMS = [
    "qwen2",
    "olmo3",
    "exaone4",
    "cohere2",
    "gemma4",
    "gemma4_e",
    "gemma4_unshared",
    "step3p7",
    "gpt_oss_mxfp4",
    "mimo_v2_flash_fp8",
]
# The published multimodal wrappers (*ForConditionalGeneration, tiny vision / audio towers):
# the hub's `language_model.model.*` layout (Gemma 3, Llama 4) and transformers 5's
# `model.language_model.*` (Gemma 4, and Gemma 3 rewritten so).
WRAPPERS = ["gemma3_vl", "gemma3_vl_modules", "llama4_vl", "gemma4_vl"]
# Legacy config forms: transformers computes the very same logits from them as from the current
# form (checked when the fixtures are made), so reading them must give the very same spec.
LEGACY = {"gemma3_legacy": "gemma3", "gpt_oss_legacy": "gpt_oss"}


def run_engine(
    path,
    *,
    hybrid_memory=True,
    page_size=4,
    chunk=8,
    dtype="float32",
    kv="fp32",
    attention="xla",
    dequantize_weights=False,
    mesh=None,
    scan=True,
):
    pallas = attention == "pallas"
    decoder = load_decoder(path, dtype=dtype, dequantize_weights=dequantize_weights, mesh=mesh)
    model = HybridLM(
        decoder, dtype=kv, implementation=attention, interpret=pallas, mesh=mesh, scan_layers=scan
    )
    cfg = model.spec.hybrid
    if hybrid_memory and cfg.layer_mix != "full_only":
        sizes = sizing.solve_pool_sizes(cfg, 256, ratio=0.5, page_size=page_size)
    else:
        sizes = sizing.PoolSizes("single", 256, 256, page_size)
    engine = engine_for(
        cfg,
        model,
        sizes,
        EngineOptions(max_running=4, max_context=64, chunk_size=chunk, eviction_interval=1),
    )
    case = json.loads((path / "greedy.json").read_text())
    rid = engine.add_request(
        case["prompt"], SamplingParams(temperature=0.0, max_tokens=8), keep_logits=True
    )
    engine.run()
    req = engine.requests[rid]
    return np.stack(req.logits[: len(case["prompt"])]), req.output, case["greedy"], engine


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@functools.cache
def default_run(family):
    """`run_engine` with the default settings, once per worker: the hybrid-off test compares
    with the very run the transformers test checked (the two share an xdist group)."""
    return run_engine(FIXTURES / family)


def grouped(families, slow=()):
    """Parameters that run on the family's worker (`default_run` is computed there once)."""
    return [
        pytest.param(
            f,
            marks=[pytest.mark.xdist_group(f"family-{f}")]
            + ([pytest.mark.slow] if f in slow else []),
        )
        for f in families
    ]


# Every family again with its window (or attention chunk) widened to 16 tokens: wider than the
# chunks (8) and pages (4) of these runs and two thirds of the prompt, where the base fixtures'
# windows (5-6) are narrower than all of them (tools/make_fixtures.py, WIDE).
WIDE = [
    "qwen3",
    "qwen2",
    "mistral",
    "gpt_oss",
    "gemma3",
    "olmo3",
    "exaone4",
    "cohere2",
    "mimo_v2_flash",
    "step3p7",
    "gemma4_e",
    "llama4",
]
WIDE_DEFAULT = {"gpt_oss", "mimo_v2_flash", "llama4", "gemma4_e"}
WIDE_SLOW = {f"{f}_wide" for f in WIDE if f not in WIDE_DEFAULT}


@pytest.mark.parametrize(
    "family",
    grouped(FAMILIES + FORMS + WRAPPERS + [f"{f}_wide" for f in WIDE], slow=WIDE_SLOW),
)
def test_matches_transformers_inside_the_engine(family):
    path = FIXTURES / family
    logits, output, greedy, engine = default_run(family)
    expected = np.load(path / "logits.npy")
    assert rel_err(logits, expected) <= 1e-4
    assert output == greedy
    # The prompt is the prefix cache's; only decoded tokens leave a window in this run, which
    # a 16-token window outlasts.
    if engine.model.spec.hybrid.layer_mix == "hybrid" and not family.endswith("_wide"):
        assert engine.metrics[-1].swa_used < engine.metrics[-1].full_used  # SWA KV was freed


@pytest.mark.parametrize("legacy, current", LEGACY.items())
def test_legacy_config_forms_read_as_the_current_form(legacy, current):
    from swajax.models.loading import spec_of

    assert np.array_equal(
        np.load(FIXTURES / legacy / "logits.npy"), np.load(FIXTURES / current / "logits.npy")
    )
    assert spec_of(FIXTURES / legacy) == spec_of(FIXTURES / current)


def test_step3_hub_config_form_reads_as_the_converted_form():
    """Step-3.5-Flash's hub config lists RoPE bases and partial factors per layer, names the KV
        heads num_attention_groups and the sliding heads attention_other_setting; transformers
        converts that into what the fixture's config holds (MoE layers listed in moe_layers_enum
    included)."""
    from swajax.models.family_specs import model_spec

    cfg = json.loads((FIXTURES / "step3p7" / "config.json").read_text())
    converted = (
        "rope_parameters",
        "per_layer_config",
        "num_key_value_heads",
        "num_sliding_attention_heads",
        "mlp_layer_types",
    )
    hub = {k: v for k, v in cfg["text_config"].items() if k not in converted}
    hub.update(
        rope_theta=[5e6, 1e4, 1e4, 5e6],
        partial_rotary_factors=[0.5, 1.0, 1.0, 0.5],
        num_attention_groups=2,
        attention_other_setting={"num_attention_heads": 8, "num_attention_groups": 2},
        moe_layers_enum="1,2",  # the MoE layers by index (Step-3.5-Flash: "3,4,...,44")
    )
    assert model_spec({"model_type": "step3p7", "text_config": hub}) == model_spec(cfg)
    hub["moe_layers_enum"] = "1,7"
    with pytest.raises(ConfigError, match="outside 0..3"):
        model_spec({"model_type": "step3p7", "text_config": hub})


BF16_SLOW = {"qwen3", "mimo_v2_flash", "gemma3", "llama4"}  # paths mistral / gpt_oss cover


@pytest.mark.parametrize(
    "family", [pytest.param(f, marks=pytest.mark.slow) if f in BF16_SLOW else f for f in FAMILIES]
)
def test_bfloat16_stays_close_to_float32(family):
    """Parameters, activations and KV in bfloat16 (norms, softmax, routers, sinks in float32).

    Stated tolerance, per prompt position, relative to the largest float32 logit: median error
    <= TOLERANCE['bfloat16'] and max <= 0.15, since in a MoE family a bf16 rounding can flip a
    router's near-tie and change one position's experts (transformers' own bf16 MiMo run is
    10.6% off at worst). Greedy tokens equal the float32 ones, except from a step where the
    float32 top-2 margin is within the measured bf16 error (then neither choice is wrong).
    """
    path = FIXTURES / family
    logits, output, greedy, _ = run_engine(path, dtype="bfloat16", kv="bf16")
    expected = np.load(path / "logits.npy")
    per_position = np.abs(logits - expected).max(axis=1) / np.abs(expected).max()
    assert np.median(per_position) <= TOLERANCE["bfloat16"]
    assert per_position.max() <= 0.15
    if output != greedy:
        step = next(i for i, (a, b) in enumerate(zip(output, greedy, strict=True)) if a != b)
        assert output[:step] == greedy[:step]
        _, _, _, engine = run_engine(path)  # float32 logits of the generated positions
        row = np.sort(engine.requests[0].logits[len(expected) - 1 + step])
        error = np.median(np.abs(logits - expected).max(axis=1))
        assert row[-1] - row[-2] <= 2 * error, (step, row[-1] - row[-2], error)


NEW_FAMILIES = ["olmo3", "exaone4", "cohere2", "gemma4", "gemma4_e", "step3p7"]
# Default run: GPT-OSS (sinks, MoE), MiMo-V2-Flash (other KV heads per kind), Gemma 3 (soft
# caps) and Gemma 4 (KV-shared layers, keys that are values); the others' hybrid-off runs go to
# -m slow (their engine runs above already evict every step).
OFF_SLOW = {"llama4", "qwen3", "mistral", "olmo3", "exaone4", "cohere2", "gemma4_e", "step3p7"}


@pytest.mark.parametrize("family", grouped(FAMILIES + NEW_FAMILIES, slow=OFF_SLOW))
def test_hybrid_memory_off_gives_the_same_logits(family):
    on, out_on, _, _ = default_run(family)
    off, out_off, _, _ = run_engine(FIXTURES / family, hybrid_memory=False, page_size=1, chunk=None)
    assert rel_err(off, on) <= 1e-5 and out_on == out_off


# Every family with its layers scanned (the default run) and unrolled. Where a family's layers
# repeat, the scan runs them with a traced pool slot: the same logits and tokens either way.
SCANNED = [
    "gpt_oss",
    "llama4",
    "mimo_v2_flash",
    "gemma4_unshared",
    "gemma3",
    "qwen3",
    "mistral",
    "qwen2",
    "olmo3",
    "exaone4",
    "cohere2",
]
SCAN_SLOW = {"llama4", "gemma3", "qwen3", "mistral", "qwen2", "olmo3", "exaone4", "cohere2"}
# Never scanned: KV-shared layers or per-layer inputs (Gemma 4 E), layers that never repeat
# (Step 3.x's fixture), DeepSeek-V4 (its layers' stores differ).
UNSCANNED = ["gemma4", "gemma4_e", "step3p7", "deepseek_v4", "deepseek_v4_wide"]


@pytest.mark.parametrize("family", grouped(SCANNED, slow=SCAN_SLOW))
def test_scanned_and_unrolled_give_the_same_logits(family):
    scanned, out_scanned, _, engine = default_run(family)
    assert any(isinstance(x, LayerStack) for x in engine.model.decoder.layers)
    unrolled, out_unrolled, _, engine = run_engine(FIXTURES / family, scan=False)
    assert not any(isinstance(x, LayerStack) for x in engine.model.decoder.layers)
    np.testing.assert_allclose(unrolled, scanned, rtol=1e-5, atol=1e-5)
    assert out_scanned == out_unrolled


@pytest.mark.parametrize("family", UNSCANNED)
def test_families_that_are_never_scanned(family):
    model = HybridLM(load_decoder(FIXTURES / family))
    assert not any(isinstance(x, LayerStack) for x in model.decoder.layers)


def test_orbax_round_trip(tmp_path):
    src = FIXTURES / "gpt_oss"
    save_orbax(load_decoder(src), src, tmp_path / "converted")
    assert not list((tmp_path / "converted").glob("*.safetensors"))  # only orbax params
    shutil.copy(src / "greedy.json", tmp_path / "converted")
    a, out_a, _, _ = run_engine(src)
    b, out_b, _, _ = run_engine(tmp_path / "converted")
    np.testing.assert_array_equal(a, b)
    assert out_a == out_b


@pytest.mark.parametrize("family", ["gpt_oss", "deepseek_v4"])
def test_a_folder_converted_with_the_head_as_a_kernel_still_loads(tmp_path, family):
    """Folders converted before the untied head was stored [V, H] (`layers.Head`) hold it as
    a Linear kernel [H, V]: restored as written, transposed into place."""
    import orbax.checkpoint as ocp
    from flax import nnx

    src, out = FIXTURES / family, tmp_path / "converted"
    decoder = load_decoder(src)
    save_orbax(decoder, src, out)
    state = nnx.state(decoder)
    name = "lm_head" if "lm_head" in state else "head"
    weight = state[name]["weight"]
    state[name] = nnx.State({"kernel": weight.replace(weight.get_value().T)})
    shutil.rmtree(out / "params")
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(out / "params", state)
    checkpointer.wait_until_finished()
    restored = load_decoder(out)
    head = getattr(restored, name).weight[...]
    np.testing.assert_array_equal(head, getattr(decoder, name).weight[...])


def _copy(tmp_path, family):
    dst = tmp_path / family
    shutil.copytree(FIXTURES / family, dst)
    return dst


def test_missing_tensor_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    dst = _copy(tmp_path, "qwen3")
    weights = load_file(str(dst / "model.safetensors"))
    del weights["model.layers.1.self_attn.k_norm.weight"]
    save_file(weights, str(dst / "model.safetensors"))
    with pytest.raises(LoadError, match="model.layers.1.self_attn.k_norm.weight.*missing"):
        load_decoder(dst)


def test_wrong_shape_names_both_shapes(tmp_path):
    from safetensors.numpy import load_file, save_file

    dst = _copy(tmp_path, "mistral")
    weights = load_file(str(dst / "model.safetensors"))
    weights["model.layers.0.mlp.up_proj.weight"] = np.zeros((127, 64), np.float32)
    save_file(weights, str(dst / "model.safetensors"))
    with pytest.raises(LoadError, match=r"up_proj.weight.*\(64, 127\), expected \(64, 128\)"):
        load_decoder(dst)


def test_unknown_family_without_layer_types(tmp_path):
    dst = _copy(tmp_path, "mistral")
    config = json.loads((dst / "config.json").read_text())
    config["model_type"] = "mystery"
    (dst / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="layer_types"):
        load_decoder(dst)


def test_convert_cli(tmp_path, capsys):
    from swajax.cli.main import main

    out = tmp_path / "orbax"
    assert main(["convert", str(FIXTURES / "mistral"), str(out)]) == 0
    assert (out / "config.json").exists() and (out / "params").is_dir()
    a = load_decoder(FIXTURES / "mistral")
    b = load_decoder(out)
    np.testing.assert_array_equal(np.asarray(a.embed[...]), np.asarray(b.embed[...]))
    assert main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "x")]) != 0
    assert "config.json" in capsys.readouterr().err


def test_a_failed_convert_leaves_the_output_as_it_was(tmp_path, capsys, monkeypatch):
    """`--force` over an existing checkpoint: the save fails half-way; the old folder (another
    model's config and params) is untouched and no temporary folder is left behind."""
    from swajax.cli.main import main
    from swajax.models import loading

    out = tmp_path / "ckpt"
    assert main(["convert", str(FIXTURES / "qwen3"), str(out)]) == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    class Failing:
        def save(self, path, state):
            (path / "partial").mkdir(parents=True)
            raise OSError("disk full")

    monkeypatch.setattr(loading, "_checkpointer", lambda: Failing())
    assert main(["convert", str(FIXTURES / "mistral"), str(out), "--force"]) == 2
    assert "disk full" in capsys.readouterr().err
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    monkeypatch.undo()
    assert load_decoder(out).spec.family == "llama"  # still the qwen3 checkpoint
    assert main(["convert", str(FIXTURES / "mistral"), str(out), "--force"]) == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == "mistral"


def test_sharded_and_bf16_checkpoints(tmp_path):
    """A checkpoint split over two files with an index, stored in bf16, loads (no torch)."""
    import ml_dtypes
    from safetensors.numpy import load_file, save_file

    dst = _copy(tmp_path, "gemma3")  # tied embeddings: no lm_head tensor in the file
    weights = load_file(str(dst / "model.safetensors"))
    assert "lm_head.weight" not in weights
    (dst / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for file, keys in shards.items():
        save_file({k: weights[k].astype(ml_dtypes.bfloat16) for k in keys}, str(dst / file))
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = load_decoder(dst)
    reference = load_decoder(FIXTURES / "gemma3")
    a, b = np.asarray(loaded.embed[...]), np.asarray(reference.embed[...])
    assert not np.array_equal(a, b) and np.allclose(a, b, rtol=1e-2, atol=1e-2)  # bf16-rounded


def test_step3_multi_token_prediction_layers_are_ignored(tmp_path):
    """Step 3.x hub checkpoints carry their MTP layers after the decoder's; loading skips them
    (as transformers does) and the logits do not change."""
    from safetensors.numpy import load_file, save_file

    dst = _copy(tmp_path, "step3p7")
    weights = load_file(str(dst / "model.safetensors"))
    weights["model.layers.4.self_attn.q_proj.weight"] = weights[
        "model.layers.0.self_attn.q_proj.weight"
    ]
    save_file(weights, str(dst / "model.safetensors"))
    with pytest.raises(LoadError, match="model.layers.4.self_attn.q_proj.weight"):
        load_decoder(dst)  # not declared: an unread tensor
    cfg = json.loads((dst / "config.json").read_text())
    cfg["text_config"]["num_nextn_predict_layers"] = 1
    (dst / "config.json").write_text(json.dumps(cfg))
    import jax
    from flax import nnx

    loaded, original = nnx.state(load_decoder(dst)), nnx.state(load_decoder(FIXTURES / "step3p7"))
    assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool((a == b).all()), loaded, original)))


def test_convert_keeps_the_checkpoints_files_and_dtype(tmp_path, cli):
    """A converted folder keeps the tokenizer, the generation config and the weights' dtype:
    it generates and stops where the original does."""
    import shutil

    import jax
    import orbax.checkpoint as ocp

    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "mimo_v2_flash", src)  # eos 2 is its 4th greedy token
    (src / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    (src / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    out = tmp_path / "out"
    assert cli("convert", src, out)[0] == 0
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (src / name).read_bytes()
    assert not list(out.glob("*.safetensors"))
    case = json.loads((src / "greedy.json").read_text())
    ids = ",".join(map(str, case["prompt"]))
    lines = [cli("generate", "--model", d, "--prompt-ids", ids, "--json")[1] for d in (src, out)]
    tokens = [json.loads(x.splitlines()[0])["tokens"] for x in lines]
    assert tokens[0] == tokens[1] == [83, 18, 96, 2]
    demo = tmp_path / "demo"
    assert cli("convert", ROOT / "swajax" / "demo", demo)[0] == 0  # a bfloat16 checkpoint
    meta = ocp.StandardCheckpointer().metadata(str(demo / "params")).item_metadata
    assert "bfloat16" in {str(leaf.dtype) for leaf in jax.tree.leaves(meta)}
    assert not (demo / "__init__.py").exists()


@pytest.mark.parametrize(
    "stray", ["language_model.model.layers.0.stray.weight", "vision_tower_extra.weight"]
)
def test_a_wrapper_tensor_no_list_names_is_still_an_error(tmp_path, stray):
    from swajax.models.checkpoint import Checkpoint
    from swajax.models.export import write_safetensors

    folder = tmp_path / "vl"
    shutil.copytree(FIXTURES / "gemma3_vl", folder)
    ckpt = Checkpoint([FIXTURES / "gemma3_vl" / "model.safetensors"])
    tensors = {ckpt.stored_name(n): np.asarray(ckpt.array(n)) for n in ckpt.names()}
    tensors[stray] = np.zeros(3, np.float32)
    write_safetensors(folder / "model.safetensors", tensors)
    with pytest.raises(LoadError, match=f"does not use checkpoint tensor\\(s\\) \\['{stray}'\\]"):
        load_decoder(folder)
