"""DeepSeek-V4 against transformers, inside the engine (tools/make_fixtures.py builds both
fixtures: window 7 / 9, compress rates 4 and 8 / 3 and 6, an 80-token prompt).

Every run has chunked prefill and evicts the window after every step, so each entry is made
from pending projections read back from the SWA pool, often across chunks; the rates 3 and 6
divide neither the page sizes nor the chunks. Logits within 1e-4 of transformers' float32, the
greedy continuation identical, both pools entirely free afterwards.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FIXTURES
from helpers.engine_checks import check_clean
from jax.sharding import PartitionSpec as P

from swajax.api import EngineSpec, make_engine
from swajax.memory.mesh_axis import AXIS
from swajax.models import load_decoder
from swajax.models.sharding import kv_mesh
from swajax.serving.sampling_params import SamplingParams

SPEC = EngineSpec.of(
    kv_budget_gib=0.002, page_size=4, chunk_size=8, eviction_interval=1, max_context=128
)


# Per fixture: pages and chunks that make the second run's hit end between two window ends of
# its HCA layers (deepseek_v4: 60; deepseek_v4_odd: 64, between those of its CSA layers too;
# the wide ones, windows 15 and 23 over rates 4 / 8 and 3 / 12: 76).
BETWEEN = {
    "deepseek_v4": dict(page_size=2, chunk_size=10),
    "deepseek_v4_odd": {},
    "deepseek_v4_wide": {},
    "deepseek_v4_wide_odd": {},
}


@pytest.fixture(scope="module", params=sorted(BETWEEN))
def fixture(request):
    path = FIXTURES / request.param
    case = json.loads((path / "greedy.json").read_text())
    return load_decoder(path), case, np.load(path / "logits.npy"), BETWEEN[request.param]


def run(decoder, spec, prompts, max_tokens=8):
    engine = make_engine(decoder, spec)
    rids = []
    for prompt in prompts:  # one after the other: a later one may hit an earlier one's prefix
        rids.append(
            engine.add_request(
                prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens), keep_logits=True
            )
        )
        engine.run()
    return engine, [engine.requests[r] for r in rids]


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# The default run: the fixture with both the wide windows and the odd rates; the others with
# `-m slow` (the same property on narrower or evenly spaced boundaries).
@pytest.mark.parametrize(
    "fixture",
    [
        n if n == "deepseek_v4_wide_odd" else pytest.param(n, marks=pytest.mark.slow)
        for n in sorted(BETWEEN)
    ],
    indirect=True,
)
def test_matches_transformers_with_a_prefix_hit_between_boundaries(fixture):
    """The prompt twice: the second finds the first cached up to a point between two window
    ends, so its first entries are made from pending projections the first request left in
    the SWA pool."""
    decoder, case, expected, between = fixture
    engine, (first, second) = run(decoder, SPEC.replace(**between), [case["prompt"]] * 2)
    assert rel_err(np.stack(first.logits[: len(case["prompt"])]), expected) <= 1e-4
    assert first.output == second.output == case["greedy"]
    hit = engine.scheduler.hit_tokens
    rates = {la.compress_rate for la in decoder.spec.hybrid.layers if la.compress_rate}
    assert hit > 0 and hit % max(rates), (hit, rates)
    tail = np.stack(second.logits[: len(case["prompt"]) - hit])
    assert rel_err(tail, expected[hit:]) <= 1e-4
    # (The wide fixtures' windows, 15 and 23, outlast the 8 decoded tokens and the prompt is the
    # prefix cache's: nothing leaves their windows in this run.)
    if decoder.spec.hybrid.layers[0].window < 15:
        assert engine.metrics[-1].swa_used < engine.metrics[-1].full_used  # the window was freed
    check_clean(engine)


SETTINGS = {
    "hybrid off": dict(hybrid_memory=False),
    "page 8 chunk 16": dict(page_size=8, chunk_size=16),
    "no chunking": dict(chunk_size=None, prefix_cache=False),
    "pallas": dict(attention="pallas"),  # the compressed attention runs on the XLA path
}
# The default run takes one setting per fixture; the rest run with `-m slow`.
DEFAULT = {("deepseek_v4_odd", "hybrid off")}
CASES = [
    pytest.param(f, v, marks=() if (f, v) in DEFAULT else pytest.mark.slow, id=f"{f}-{v}")
    for f in sorted(BETWEEN)
    for v in SETTINGS
]


@pytest.mark.parametrize("fixture, setting", CASES, indirect=["fixture"])
def test_memory_settings_give_the_same_tokens(fixture, setting):
    decoder, case, expected, _ = fixture
    engine, (req,) = run(decoder, SPEC.replace(**SETTINGS[setting]), [case["prompt"]])
    assert req.output == case["greedy"]
    assert rel_err(np.stack(req.logits[: len(case["prompt"])]), expected) <= 1e-4
    check_clean(engine)


@pytest.mark.parametrize(
    "fixture",
    ["deepseek_v4_odd", pytest.param("deepseek_v4", marks=pytest.mark.slow)],
    indirect=True,
)
def test_retraction_and_abort_keep_other_requests_exact(fixture):
    """The fixture prompt runs beside two others; it is retracted mid-prefill and again
    mid-decode, and resumes (its compressor state made again from the pools); another request
    is aborted mid-prefill. The fixture prompt still gives transformers' continuation, and
    nothing leaks."""
    decoder, case, _, _ = fixture
    prompt = case["prompt"]
    engine = make_engine(decoder, SPEC.replace(decode_steps=1))  # (a round would finish it)
    rids = [
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=n))
        for p, n in ((prompt, 8), (prompt[3:60], 12), (prompt[::-1], 12))
    ]
    req = engine.requests[rids[0]]
    engine.step()
    engine.abort(rids[1])
    while req.kv_len < 20:
        engine.step()
    assert req.kv_len < len(prompt)
    engine.scheduler.retract(req)
    while len(req.output) < 3:
        engine.step()
    engine.scheduler.retract(req)
    engine.run()
    assert req.retractions == 2 and req.output == case["greedy"]
    assert engine.requests[rids[2]].finish_reason == "length"
    check_clean(engine)


@pytest.mark.slow  # tests/models/test_sharding.py shards the other families by default
def test_tensor_parallel_over_four_devices():
    """Query heads, the experts' intermediate and the shared expert split over the 4 fake
    devices (tests/conftest.py); the one shared KV head's pools and the compressed stores are
    whole on each. Same logits and tokens."""
    path = FIXTURES / "deepseek_v4_odd"
    case = json.loads((path / "greedy.json").read_text())
    mesh = kv_mesh(4)
    engine, (req,) = run(
        load_decoder(path, mesh=mesh), SPEC.replace(tensor_parallel=4), [case["prompt"]]
    )
    assert req.output == case["greedy"]
    expected = np.load(path / "logits.npy")
    assert rel_err(np.stack(req.logits[: len(case["prompt"])]), expected) <= 1e-4
    wq_b = engine.model.decoder.layers[0].attn.wq_b.kernel.get_value()
    assert wq_b.sharding.spec == P(None, AXIS)
    pools = engine.runner.pools
    assert pools.swa_k.sharding.spec == P() and pools.compressed.entries[0].sharding.spec == P()
    assert len(pools.compressed.entries[0].sharding.device_set) == 4
    check_clean(engine)


def test_a_hit_from_the_host_tier_matches_transformers():
    """A prefix evicted to host memory (its full pages with their entry slots, its window's SWA
    pages with their pending rows) and loaded back: the fixture prompt that hits it computes
    transformers' logits and tokens. With the host copies of the compressed stores zeroed it
    does not (they are what is read)."""
    path = FIXTURES / "deepseek_v4_odd"
    decoder, case = load_decoder(path), json.loads((path / "greedy.json").read_text())
    prompt, expected = case["prompt"], np.load(path / "logits.npy")
    shared = prompt[:64]  # a node boundary between window ends (rates 3 and 6)
    # Chunks of 16: the node ending at 64 is longer than the window, so the host keeps all of
    # the window a hit needs (it keeps one node's last window, not one spread over two).
    spec = SPEC.replace(chunk_size=16, host_cache_gib=0.001)

    def evicted_then_hit(zero_compressed=False):
        engine = make_engine(decoder, spec)
        for first in (shared + [9, 10, 11, 12, 13, 14], shared + [5, 6, 7, 8]):  # a branch
            engine.add_request(first, SamplingParams(temperature=0.0, max_tokens=2))
            engine.run()
        engine.cache.evict(10**9, 10**9)
        if zero_compressed:
            engine.flush()
            engine.runner.host_kv.settle()
            for stores in engine.runner.host_kv.stores.values():
                for store in stores[2:]:  # after K and V: the compressed stores
                    store[...] = 0
        rid = engine.add_request(
            prompt, SamplingParams(temperature=0.0, max_tokens=8), keep_logits=True
        )
        engine.run()
        return engine, engine.requests[rid]

    engine, req = evicted_then_hit()
    tier = engine.cache.tier
    assert req.cached_tokens == 64 and tier.loaded[0] > 0 and tier.loaded[1] > 0
    assert req.output == case["greedy"]
    assert rel_err(np.stack(req.logits[: len(prompt) - 64]), expected[64:]) <= 1e-4
    check_clean(engine)
    _, zeroed = evicted_then_hit(zero_compressed=True)
    assert rel_err(np.stack(zeroed.logits[: len(prompt) - 64]), expected[64:]) > 1e-2


def test_the_hubs_tensor_names_and_its_mtp_layers_load(tmp_path):
    """The hub publishes DeepSeek-V4 without transformers' `model.` prefix (`embed.weight`,
    `layers.N.attn.*`, `hc_head_fn`), its KV norms as `attn.kv_norm` (transformers writes
    `attn.norm`) and with its multi-token-prediction layers (`mtp.*`), which the decoder
    declares and skips; the same parameters load. A tensor nothing reads is still an error
    naming it."""
    import shutil

    import jax
    from flax import nnx
    from safetensors.numpy import load_file, save_file

    from swajax.models import LoadError

    dst = tmp_path / "v4"
    shutil.copytree(FIXTURES / "deepseek_v4", dst)
    weights = load_file(str(dst / "model.safetensors"))
    hub = {}
    for name, value in weights.items():
        name = name.removeprefix("model.").replace("embed_tokens.", "embed.")
        name = name.replace(".attn.norm.", ".attn.kv_norm.")
        hub[name.replace("hc_head.hc_", "hc_head_")] = value
    assert sum(".attn.kv_norm." in name for name in hub) == 3
    hub["mtp.0.attn.wq_a.weight"] = hub["layers.0.attn.wq_a.weight"]
    save_file(hub, str(dst / "model.safetensors"))
    loaded = nnx.state(load_decoder(dst))
    original = nnx.state(load_decoder(FIXTURES / "deepseek_v4"))
    same = jax.tree.map(lambda a, b: bool((a == b).all()), loaded, original)
    assert all(jax.tree.leaves(same))
    hub["layers.0.attn.stray.weight"] = hub["layers.0.attn.wq_a.weight"]
    save_file(hub, str(dst / "model.safetensors"))
    with pytest.raises(LoadError, match="layers.0.attn.stray.weight"):
        load_decoder(dst)


def test_export_writes_the_hubs_names_and_the_original_tensors():
    """`swajax convert --to hf` inverts every layout (grouped wo_a, stacked experts, the hash
    table) and writes the hub's names; each is a tensor of the fixture, bit for bit, and every
    one of the fixture's comes back (transformers loads the export to the fixture's logits:
    tools/check_hf_export.py)."""
    from swajax.models.checkpoint import Checkpoint
    from swajax.models.deepseek_v4 import Names
    from swajax.models.export import hf_tensors
    from swajax.models.loading import checkpoint_files

    folder = FIXTURES / "deepseek_v4"
    exported = hf_tensors(load_decoder(folder))
    source = Checkpoint(checkpoint_files(folder), ())
    names = Names(source.names())
    assert not any(name.startswith("model.") for name in exported)
    for name, value in exported.items():
        # transformers' save_pretrained wrote two top-level tensors under its own names
        alias = name.replace("embed.", "embed_tokens.").replace("hc_head_", "hc_head.hc_")
        alias = alias.replace(".attn.kv_norm.", ".attn.norm.")
        np.testing.assert_array_equal(value, source.array(names(name, alias)), err_msg=name)
    assert source.unconsumed() == []


def test_block_fp8_weights_stay_fp8_and_match_transformers():
    """The published form: attention projections and experts in float8 with block scales
    (tools/fixture_forms.py), kept so on the device and dequantized inside the step; the
    compressors' projections are float as published. Logits within 1e-4 of transformers'
    reading of the same files, tokens equal."""
    path = FIXTURES / "deepseek_v4_fp8"
    case = json.loads((path / "greedy.json").read_text())
    decoder = load_decoder(path)
    attn = decoder.layers[1].attn
    assert attn.wq_a.kernel.get_value().dtype == jnp.float8_e4m3fn
    assert decoder.layers[1].ffn.gate_up.get_value().dtype == jnp.float8_e4m3fn
    assert attn.compressor.wkv.kernel.get_value().dtype == jnp.float32
    engine, (req,) = run(decoder, SPEC, [case["prompt"]])
    assert req.output == case["greedy"]
    expected = np.load(path / "logits.npy")
    assert rel_err(np.stack(req.logits[: len(case["prompt"])]), expected) <= 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["decode_steps", "speculative"])
def test_multi_step_decode_and_speculation_give_transformers_tokens(fixture, setting):
    """Several decode steps in one program, and draft-and-verify rounds (the model drafting for
    itself): entries made inside a round, rejected positions' pending rows overwritten."""
    decoder, case, _, _ = fixture
    if setting == "decode_steps":
        engine, (req,) = run(decoder, SPEC.replace(decode_steps=4), [case["prompt"]])
    else:
        engine = make_engine(decoder, SPEC.replace(num_speculative_tokens=3), draft=decoder)
        rid = engine.add_request(case["prompt"], SamplingParams(temperature=0.0, max_tokens=8))
        engine.run()
        req = engine.requests[rid]
    assert req.output == case["greedy"]
    check_clean(engine)


def test_sinkhorn_iterations_are_a_loop_not_a_longer_program():
    """mHC's Sinkhorn-Knopp iterations run as a loop on device: 20 iterations trace to the same
    program as 2 (unrolled, they were most of V4's step program); the loop computes what the
    iterations written out in numpy compute (the fixtures check the whole model against
    transformers)."""
    import jax

    from swajax.models.hyper_connection import HyperConnection

    rng = np.random.default_rng(0)
    streams = jnp.asarray(rng.normal(size=(3, 4, 8)), jnp.float32)
    sizes = {}
    for iters in (2, 20):
        hc = HyperConnection(4, 8, iters, 1e-6, 1e-6)
        for part in (hc.fn, hc.base, hc.scale):
            part[...] = jnp.asarray(rng.normal(size=part.shape), jnp.float32)
        sizes[iters] = len(jax.make_jaxpr(lambda s, hc=hc: hc(s))(streams).eqns)
    assert sizes[2] == sizes[20]
    _, comb, _ = hc(streams)  # the 20-iteration one
    flat = np.asarray(streams, np.float64).reshape(3, -1)
    flat = flat / np.sqrt(np.mean(flat**2, axis=-1, keepdims=True) + 1e-6)
    fn, base, scale = (np.asarray(p[...], np.float64) for p in (hc.fn, hc.base, hc.scale))
    logits = (flat @ fn.T)[:, 8:].reshape(-1, 4, 4) * scale[2] + base[8:].reshape(4, 4)
    ref = np.exp(logits - logits.max(-1, keepdims=True))
    ref = ref / ref.sum(-1, keepdims=True) + 1e-6
    ref = ref / (ref.sum(-2, keepdims=True) + 1e-6)
    for _ in range(19):
        ref = ref / (ref.sum(-1, keepdims=True) + 1e-6)
        ref = ref / (ref.sum(-2, keepdims=True) + 1e-6)
    np.testing.assert_allclose(np.asarray(comb), ref, rtol=1e-5, atol=1e-6)
