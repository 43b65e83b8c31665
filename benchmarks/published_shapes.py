"""Random checkpoints at published models' shapes, in the hub's layout, and what the engine does
with them on this machine: bytes on disk, weights as loaded, peak resident memory, load time,
decode tokens/s.

    python benchmarks/published_shapes.py write gpt-oss-20b DIR [--layers N]
    python benchmarks/published_shapes.py write gemma-3-27b|gemma-4-31b|llama-4-scout DIR
    python benchmarks/published_shapes.py run DIR [--dtype bfloat16] [--new 16] [--batch B]
                                                  [--unroll-layers]

`write` makes gpt-oss-20b's checkpoint as the hub ships it (its published config: hidden 2880,
64 query / 8 KV heads of 64, 32 experts top-4 with MXFP4 blocks and E8M0 scales, vocabulary
201,088, window 128, YaRN; everything but the experts in bfloat16), one safetensors shard per
layer plus one for the embeddings and head; `--layers` cuts the depth (24 published). Values are
random but finite and small (scales near 2^-7), so the model runs like a real one. The other
models are written from their published configs (`swajax.presets`) by `write_model`, through
the decoder's own tensor walk, bfloat16 throughout. `run` loads the folder through
`swajax.LLM` and generates, in this process, printing one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import time
from pathlib import Path

import numpy as np

GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "pad_token_id": 199999,
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 201088,
}
# Other families, from their published configs (`swajax.presets`, each naming its source),
# written by the decoder's own tensor walk (`write_model`) under the names their hub
# checkpoints use: the text model inside the multimodal wrapper, as transformers 4 saved Gemma
# 3 and Llama 4 (`language_model.model.*`, `language_model.lm_head.*`) and transformers 5 saves
# Gemma 4 (`model.language_model.*`).
FAMILIES = {
    "gemma-3-27b": ("language_model.model.", "language_model.lm_head."),
    "gemma-4-31b": ("model.language_model.", "lm_head."),
    "llama-4-scout": ("language_model.model.", "language_model.lm_head."),
}
MODELS = {"gpt-oss-20b": GPT_OSS_20B, **dict.fromkeys(FAMILIES)}


def _bf16(rng, *shape, scale=None):
    import ml_dtypes

    scale = shape[-1] ** -0.5 if scale is None else scale
    return (rng.standard_normal(shape, np.float32) * scale).astype(ml_dtypes.bfloat16)


def write_gpt_oss(config: dict, folder: Path, layers: int) -> int:
    """The checkpoint's shards; returns the bytes written."""
    from swajax.models.export import write_safetensors

    c = dict(config, num_hidden_layers=layers)
    c["layer_types"] = [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
    ]
    h, e, i_ = c["hidden_size"], c["num_local_experts"], c["intermediate_size"]
    heads, kv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    weight_map, total = {}, 0

    def shard(name: str, tensors: dict) -> None:  # written as made: one shard in memory
        nonlocal total
        write_safetensors(folder / name, tensors)
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(x.nbytes for x in tensors.values())

    shard(
        "model-embeddings.safetensors",
        {
            "model.embed_tokens.weight": _bf16(rng, c["vocab_size"], h, scale=1.0),
            "lm_head.weight": _bf16(rng, c["vocab_size"], h),
            "model.norm.weight": np.ones(h, np.float32).astype(_bf16(rng, 1).dtype),
        },
    )
    for layer in range(layers):
        pre, t = f"model.layers.{layer}", {}
        for name, out in (("q_proj", heads * d), ("k_proj", kv * d), ("v_proj", kv * d)):
            t[f"{pre}.self_attn.{name}.weight"] = _bf16(rng, out, h)
            t[f"{pre}.self_attn.{name}.bias"] = _bf16(rng, out, scale=0.02)
        t[f"{pre}.self_attn.o_proj.weight"] = _bf16(rng, h, heads * d)
        t[f"{pre}.self_attn.o_proj.bias"] = _bf16(rng, h, scale=0.02)
        t[f"{pre}.self_attn.sinks"] = _bf16(rng, heads, scale=1.0)
        t[f"{pre}.mlp.router.weight"] = _bf16(rng, e, h)
        t[f"{pre}.mlp.router.bias"] = _bf16(rng, e, scale=0.02)
        for name, rows, cols in (("gate_up_proj", 2 * i_, h), ("down_proj", h, i_)):
            t[f"{pre}.mlp.experts.{name}_blocks"] = rng.integers(
                0, 256, (e, rows, cols // 32, 16), dtype=np.uint8
            )
            # E8M0 exponents near 2^-7: FP4 values up to 6 become at most ~0.05
            t[f"{pre}.mlp.experts.{name}_scales"] = rng.integers(
                117, 122, (e, rows, cols // 32), dtype=np.uint8
            )
            t[f"{pre}.mlp.experts.{name}_bias"] = _bf16(rng, e, rows, scale=0.02)
        for name in ("input_layernorm", "post_attention_layernorm"):
            t[f"{pre}.{name}.weight"] = np.ones(h, np.float32).astype(_bf16(rng, 1).dtype)
        shard(f"model-layer-{layer:05d}.safetensors", t)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps(c, indent=2))
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def model_config(name: str, layers: int | None, config: dict | None = None) -> dict:
    """A published config (or `config`) at `layers` of its depth: per-layer lists cut."""
    from swajax.presets import PRESETS, at_depth

    cfg = at_depth(config if config is not None else PRESETS[name], layers)
    text = cfg.get("text_config", cfg)
    text.setdefault("torch_dtype", "bfloat16")
    return cfg


class _ShapeWriter:
    """The checkpoint's tensor names and shapes, from the decoder's own export walk
    (`swajax.models.export.WeightWriter`) over zero-filled parameters made one at a time (a
    parameter is held only while its layout is inverted)."""

    def __init__(self):
        from swajax.models.export import WeightWriter

        self.writer, self.shapes = WeightWriter(), {}

    def __getattr__(self, method):
        call = getattr(self.writer, method)

        def run(*params, **kw):
            concrete = [_Zeros(p) if hasattr(p, "get_value") else p for p in params]
            call(*concrete, **kw)
            for name, value in self.writer.tensors.items():
                self.shapes[name] = (value.shape, value.dtype)
            self.writer.tensors.clear()

        return run


class _Zeros:
    def __init__(self, param):
        self.value = param.get_value()

    def get_value(self):
        return np.zeros(self.value.shape, self.value.dtype)


def _random(rng, name: str, shape, dtype: np.dtype) -> np.ndarray:
    """A tensor as the decoder holds it: norm weights near 1, block-FP8 scales 2^-7, index
    tables 0, the rest of scale 1 / sqrt(fan-in) (float8 kernels as published, before their
    scales), in the tensor's own dtype."""
    if dtype.kind in "iu":
        return np.zeros(shape, dtype)
    if name.endswith("scale_inv"):
        return np.full(shape, 2.0**-7, dtype)
    if len(shape) == 1 and "norm" in name:
        return (1 + rng.standard_normal(shape, np.float32) * 0.02).astype(dtype)
    scale = 1.0 if dtype.itemsize == 1 else shape[-1] ** -0.5
    return (rng.standard_normal(shape, np.float32) * scale).astype(dtype)


def write_model(name: str, folder: Path, layers: int | None, *, config: dict | None = None) -> int:
    """A random checkpoint of `name`'s published config (or `config`) in the hub's layout:
    every tensor the decoder reads, under its hub name, layout and dtype (bfloat16, or block
    FP8 where the config says so; `_random`); one shard per layer plus one for the rest.
    Returns the bytes."""
    import re

    import jax
    from flax import nnx

    from swajax.models.decoder import decoder_for
    from swajax.models.export import write_safetensors
    from swajax.models.loading import decoder_spec

    cfg = model_config(name, layers, config)
    spec = decoder_spec(cfg, dtype="bfloat16")
    walker = _ShapeWriter()
    nnx.eval_shape(lambda: decoder_for(spec)).load(walker)
    jax.clear_caches()
    groups: dict[str, dict] = {}
    model, head = FAMILIES.get(name, ("model.", "lm_head."))
    for tensor, shape_dtype in walker.shapes.items():
        tensor = re.sub(r"^model\.", model, re.sub(r"^lm_head\.", head, tensor))
        found = re.search(r"layers\.(\d+)\.", tensor)
        key = f"model-layer-{int(found[1]):05d}" if found else "model-other"
        groups.setdefault(key, {})[tensor] = shape_dtype
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    weight_map, total = {}, 0
    for key, tensors in sorted(groups.items()):
        made = {}
        for tensor, (shape, dtype) in tensors.items():
            made[tensor] = _random(rng, tensor, shape, np.dtype(dtype))
        write_safetensors(folder / f"{key}.safetensors", made)
        weight_map.update(dict.fromkeys(made, f"{key}.safetensors"))
        total += sum(x.nbytes for x in made.values())
        del made
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


@contextlib.contextmanager
def measuring_temporaries():
    """Inside the block, each step program's temporaries (XLA's memory_analysis) are appended
    to the yielded list as (program, bytes) when the program store first meets it."""
    from swajax.runner import program_store

    temps, call = [], program_store.ProgramStore.call

    def measured(self, fn, args, statics):
        if not any(f is fn for f, _ in temps):
            analysis = fn.lower(*args, **statics).compile().memory_analysis()
            temps.append((fn, analysis.temp_size_in_bytes))
        return call(self, fn, args, statics)

    program_store.ProgramStore.call = measured
    try:
        yield temps
    finally:
        program_store.ProgramStore.call = call


def copy_gb_per_s(repeats: int = 5) -> float:
    """This machine's memory bandwidth as the floor counts it: GB copied per second by numpy's
    `copyto` of 1 GiB (each byte read once and written once), best of `repeats`."""
    a = np.ones(2**28, np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - start)
    return a.nbytes / best / 1e9


def step_bytes(spec, batch: int) -> float:
    """Bytes one decode step of `batch` tokens must read: every weight but the embedding table
    (each token reads one row of it; a tied table is read whole as the head), and of the routed
    experts the share `batch` tokens touch, E (1 - (1 - k/E)^batch) of E when each token picks
    k at random. The KV a step attends is left out: at these contexts (16-token prompts, 16 new
    tokens) it is under 2 MB."""
    from swajax.models.footprint import footprint

    fp = footprint(spec)
    table = spec.vocab_size * spec.hidden * np.dtype(spec.dtype).itemsize
    dense = fp.weight_bytes - fp.expert_bytes - (0 if spec.tie_embeddings else table)
    if not fp.experts:
        return float(dense)
    touched = 1 - (1 - fp.top_k / fp.experts) ** batch
    return dense + fp.expert_bytes * touched


def run(
    folder: Path, dtype: str, new: int, batch: int, scan_layers: bool = True, repeats: int = 3
) -> dict:
    from swajax import LLM, SamplingParams

    bandwidth = copy_gb_per_s()  # before the model takes the memory
    t0 = time.perf_counter()
    llm = LLM(str(folder), dtype=dtype, scan_layers=scan_layers)  # default pools and context
    load_s = time.perf_counter() - t0
    loaded = peak_rss_gib()
    prompts = [[(7 * i + 13 * j) % 1000 + 3 for j in range(16)] for i in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # compiles
    # The peak before measuring the temporaries: XLA's analysis compiles each program again.
    peak = peak_rss_gib()
    with measuring_temporaries() as temps:
        llm.generate(prompts, params, use_tqdm=False)
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    first = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    # Twice untimed: `new` tokens run multi-step rounds the 2-token runs never reach, and the
    # second run still compiled a step program the first had not needed (measured 2026-12-06,
    # 4.7 s of compilation in it). Decoding timed before then included compilations.
    for _ in range(2):
        llm.generate(prompts, params, use_tqdm=False)
    llm.generate(prompts, first, use_tqdm=False)

    # Decoding alone: the `new`-token run less the run that prefills and samples one token
    # (before 2026-12-06 the prefill was timed with it: at 16 tokens a prompt's prefill reads
    # most of a layer's experts, several decode steps' worth). Best of `repeats` each,
    # interleaved: the machine is shared and noisy.
    best = {new: float("inf"), 1: float("inf")}
    for _ in range(repeats):
        for p in (params, first):
            t0 = time.perf_counter()
            llm.generate(prompts, p, use_tqdm=False)
            best[p.max_tokens] = min(best[p.max_tokens], time.perf_counter() - t0)
    seconds = best[new] - best[1]
    bandwidth = max(bandwidth, copy_gb_per_s())  # the faster of before and after: the floor
    floor = batch * bandwidth * 1e9 / step_bytes(llm.engine.runner.model.spec, batch)
    tokens_per_s = batch * (new - 1) / seconds
    files = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return dict(
        folder=str(folder),
        dtype=dtype,
        checkpoint_gib=round(files / 2**30, 3),
        weights_gib=round(llm.summary()["weight_bytes"] / 2**30, 3),
        peak_rss_after_load_gib=round(loaded, 3),
        peak_rss_gib=round(peak, 3),
        load_s=round(load_s, 1),
        kv_gib=round(kv_bytes(llm) / 2**30, 3),
        step_temporaries_gib=round(max(t for _, t in temps) / 2**30, 3),
        batch=batch,
        scan_layers=scan_layers,
        decode_tokens_per_s=round(tokens_per_s, 2),
        copy_gb_per_s=round(bandwidth, 1),
        floor_tokens_per_s=round(floor, 2),
        of_floor=round(tokens_per_s / floor, 3),
    )


def kv_bytes(llm) -> int:
    """The bytes of the engine's KV pools (and compressed stores) on the device."""
    import jax

    pools = llm.engine.runner.pools if hasattr(llm.engine.runner, "pools") else None
    return sum(int(x.nbytes) for x in jax.tree.leaves(pools)) if pools is not None else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd")
    w = sub.add_parser("write")
    w.add_argument("model", choices=sorted(MODELS))
    w.add_argument("folder", type=Path)
    w.add_argument("--layers", type=int, default=None)
    r = sub.add_parser("run")
    r.add_argument("folder", type=Path)
    r.add_argument("--dtype", default="auto")
    r.add_argument("--new", type=int, default=16)
    r.add_argument("--batch", type=int, default=1)
    r.add_argument("--unroll-layers", action="store_true", help="no layer scan (as generate's)")
    p.add_argument("--smoke", action="store_true", help="a 1-layer checkpoint, written and run")
    args = p.parse_args(argv)
    if args.smoke:  # a 1-layer checkpoint, written, run and deleted
        import tempfile

        with tempfile.TemporaryDirectory(prefix="swajax_shapes_") as tmp:
            folder = Path(tmp) / "gpt-oss-20b-1layer"
            written = write_gpt_oss(GPT_OSS_20B, folder, 1)
            result = run(folder, "auto", 2, 1)
        print(json.dumps(dict(written_gib=round(written / 2**30, 3), **result)))
        return 0
    if args.cmd == "write":
        if args.model == "gpt-oss-20b":
            layers = args.layers or GPT_OSS_20B["num_hidden_layers"]
            written = write_gpt_oss(GPT_OSS_20B, args.folder, layers)
        else:
            written = write_model(args.model, args.folder, args.layers)
            layers = args.layers or "all"
        print(f"wrote {args.folder}: {layers} layers, {written / 2**30:.2f} GiB")
        return 0
    if args.cmd == "run":
        scan = not args.unroll_layers
        print(json.dumps(run(args.folder, args.dtype, args.new, args.batch, scan)))
        return 0
    p.print_help()
    return 2


if __name__ == "__main__":
    main()
