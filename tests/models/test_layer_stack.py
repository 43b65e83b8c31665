"""Layers scanned by their repeating pattern (swajax.models.layer_stack): how layers are grouped,
that scanning computes what unrolling does, and that tracing does not grow with depth."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import FIXTURES
from helpers.engine_checks import check_clean
from hypothesis import given, strategies as st

from swajax import sizing
from swajax.api import engine_for
from swajax.demo import DEMO_DIR
from swajax.models import layer_stack, layers, load_decoder
from swajax.models.decoder import Decoder, HybridLM
from swajax.models.layer_stack import LayerStack, Segment
from swajax.models.loading import decoder_spec
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams


@given(st.lists(st.integers(0, 2), max_size=40), st.integers(2, 3))
def test_runs_cover_every_layer_once_with_equal_copies(sigs, min_repeats):
    segs = layer_stack.runs(sigs, min_repeats)
    assert [i for s in segs for i in range(s.start, s.stop)] == list(range(len(sigs)))
    for s in segs:
        assert s.repeats == 1 or s.repeats >= min_repeats
        first = sigs[s.start : s.start + s.period]
        for j in range(s.repeats):
            assert sigs[s.start + j * s.period : s.start + (j + 1) * s.period] == first
        if s.repeats == 1:
            assert s.period == 1


def test_runs_take_the_pattern_that_covers_most():
    s, f = "S", "F"
    gemma3 = ([s] * 5 + [f]) * 4 + [s, s]  # 26 layers: five sliding, one full, x 4, then two
    assert layer_stack.runs(gemma3) == (Segment(0, 6, 4), Segment(24, 1, 2))
    assert layer_stack.runs([f, s, f, s, f, s, s]) == (Segment(0, 2, 3), Segment(6, 1, 1))
    assert layer_stack.runs([s, f, f, s]) == (Segment(0, 1, 1), Segment(1, 1, 2), Segment(3, 1, 1))


def demo_spec(depth: int, **changes):
    config = json.loads((DEMO_DIR / "config.json").read_text())
    kinds = ["sliding_attention", "sliding_attention", "full_attention"]
    config = dict(
        config,
        num_hidden_layers=depth,
        layer_types=(kinds * depth)[:depth],
        mlp_layer_types=["dense"] * depth,
        **changes,
    )
    return decoder_spec(config)


def test_segments_of_a_spec_follow_everything_a_layer_reads():
    spec = demo_spec(12)
    assert layer_stack.segments(spec) == (Segment(0, 3, 4),)
    # A per-layer field that differs (here the attention scale of layer 7) breaks the pattern
    scales = tuple(2.0 if i == 7 else x for i, x in enumerate(spec.scales))
    odd = dataclasses.replace(spec, scales=scales)
    assert layer_stack.segments(odd) == (
        Segment(0, 3, 2),
        Segment(6, 1, 1),
        Segment(7, 1, 1),
        Segment(8, 1, 1),
        Segment(9, 1, 2),
        Segment(11, 1, 1),
    )


def test_kv_shared_models_are_not_scanned():
    decoder = load_decoder(FIXTURES / "gemma4")
    assert all(s.repeats == 1 for s in layer_stack.segments(decoder.spec))


def serve(model, prompt, new=4):
    cfg = model.spec.hybrid
    sizes = sizing.solve_pool_sizes(cfg, 256, ratio=0.5, page_size=4)
    options = EngineOptions(max_running=2, max_context=64, chunk_size=8, eviction_interval=1)
    engine = engine_for(cfg, model, sizes, options)
    rid = engine.add_request(
        prompt, SamplingParams(temperature=0.0, max_tokens=new), keep_logits=True
    )
    engine.run()
    req = engine.requests[rid]
    check_clean(engine)
    return np.stack(req.logits), req.output


def test_tracing_does_not_grow_with_depth(monkeypatch):
    calls = []
    original = layers.Attention.__call__

    def counted(self, *args, **kwargs):
        calls.append(self.layer_id)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(layers.Attention, "__call__", counted)
    traced = {}
    # (12 layers unrolled, the costliest program to build, is implied: 6 unrolled is already
    # one trace per layer.)
    for depth, scan in ((6, True), (12, True), (6, False)):
        decoder = Decoder(demo_spec(depth))  # zero weights: only the tracing is counted
        calls.clear()
        # One chunk, one token: a single program (the prefill step) per engine is enough to
        # count its traces, and compiling no more keeps the test cheap.
        serve(HybridLM(decoder, scan_layers=scan), list(range(1, 9)), new=1)
        traced[depth, scan] = len(calls)
    assert traced[6, True] == traced[12, True]  # one period (S S F) per program
    assert traced[6, False] == 2 * traced[6, True]  # unrolled: every layer, 2 periods


def test_load_refuses_a_scanned_decoder():
    decoder = Decoder(demo_spec(6))
    decoder.scan_layers()
    assert isinstance(decoder.layers[0], LayerStack)
    with pytest.raises(ValueError, match="before scan_layers"):
        decoder.load(None)
    assert nnx.state(decoder.layers[0].stacks[0])["self_attn"]["q_proj"]["kernel"].shape[0] == 2


@pytest.mark.parametrize("scan", [True, False])
def test_engine_spec_decides_scanning(scan):
    from swajax.api import EngineSpec, make_engine
    from swajax.cli.generate import engine_fields
    from swajax.cli.main import build_parser

    argv = [
        "generate",
        "--model",
        str(FIXTURES / "gpt_oss"),
        "--kv-budget-gib",
        "0.01",
        "--context-length",
        "64",
        *([] if scan else ["--unroll-layers"]),
    ]
    spec = EngineSpec.of(**engine_fields(build_parser().parse_args(argv)))
    assert spec.scan_layers is scan
    engine = make_engine(load_decoder(FIXTURES / "gpt_oss"), spec)
    stacks = [x for x in engine.runner.model.decoder.layers if isinstance(x, LayerStack)]
    assert len(stacks) == (1 if scan else 0)


def test_a_consumed_decoder_is_never_held_twice():
    """`consume`: each scanned layer's own arrays are freed as their stack is made (a published
    model's layers are most of the machine's memory); without it the caller's decoder is left
    whole. The two models compute the same logits."""
    kept, spent = Decoder(demo_spec(6)), Decoder(demo_spec(6))
    for d in (kept, spent):  # the same (nonzero) weights in both
        for i, layer in enumerate(d.layers):
            state = nnx.state(layer)
            nnx.update(layer, jax.tree.map(lambda x, i=i: jnp.full_like(x, 0.01 * (i + 1)), state))
    leaves = lambda d: jax.tree.leaves(nnx.state(d.layers))  # noqa: E731
    a = HybridLM(kept, scan_layers=True)
    b = HybridLM(spent, scan_layers=True, consume=True)
    assert not any(x.is_deleted() for x in leaves(kept))
    assert all(x.is_deleted() for x in leaves(spent))  # every layer of S S F x 2 is scanned
    prompt = list(range(1, 9))
    np.testing.assert_array_equal(serve(a, prompt, new=2)[0], serve(b, prompt, new=2)[0])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("rows", [1, 5])
def test_a_stacked_kernel_gives_its_slices_products(monkeypatch, dtype, rows):
    """A copy's kernel read out of the stack a chunk of outputs at a time (chunks of 128 here,
    the last one overlapping) gives the products of that copy's kernel sliced out, whichever
    copy a traced index picks."""
    from swajax.memory import bits

    monkeypatch.setattr(layers, "CHUNK_BYTES", 64 * 100 * 2)  # 128 columns a chunk
    rng = np.random.default_rng(0)
    stack = jnp.asarray(rng.standard_normal((3, 64, 300)), dtype)
    x = jnp.asarray(rng.standard_normal((rows, 64)), jnp.float32)

    @jax.jit
    def stacked(x, held, copy):
        return layers.dot(x, layers.StackedKernel(held, copy, jnp.dtype(dtype).name))

    for copy in range(3):
        got = stacked(x, bits.to_bits(stack), jnp.int32(copy))
        exact = np.asarray(x, np.float64) @ np.asarray(stack[copy], np.float64)
        x_as_weight = np.asarray(x.astype(dtype), np.float64)  # the product runs in w's dtype
        np.testing.assert_allclose(
            got, x_as_weight @ np.asarray(stack[copy], np.float64), rtol=1e-5, atol=1e-5
        )
        if dtype == jnp.float32:
            np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5)
        want = jax.jit(layers.dot)(x, stack[copy])
        if dtype == jnp.bfloat16:  # the plain weight runs in the same chunks: the same bits
            np.testing.assert_array_equal(got, want)
    with pytest.raises(TypeError, match="read whole"):
        layers.StackedKernel(stack, jnp.int32(0), "bfloat16")[0]
    with pytest.raises(ValueError, match="rows-out"):
        layers.dot(x, layers.StackedKernel(stack, jnp.int32(0), "bfloat16"), w_rows_out=True)


def test_a_layer_stack_on_one_cpu_hands_its_kernels_whole(monkeypatch):
    """On one CPU device the scan hands each `Linear` its copy's kernel as a view of the stack
    (no slice of it copied per layer), and computes what the unrolled layers do."""
    seen = []
    original = layers.dot

    def dot(x, w, **kw):
        seen.append(type(w).__name__)
        return original(x, w, **kw)

    monkeypatch.setattr(layers, "dot", dot)
    decoder = load_decoder(FIXTURES / "gpt_oss")
    prompt = list(range(1, 9))
    scanned = serve(HybridLM(decoder, scan_layers=True), prompt, new=2)
    assert "StackedKernel" in seen
    seen.clear()
    unrolled = serve(HybridLM(decoder, scan_layers=False), prompt, new=2)
    assert "StackedKernel" not in seen
    np.testing.assert_allclose(scanned[0], unrolled[0], rtol=1e-5, atol=1e-5)
    assert scanned[1] == unrolled[1]


def test_split_kernels_are_read_whole_never_gathered(monkeypatch):
    """A bfloat16 [in, out] kernel whose outputs are split over devices (tensor parallel: q, k,
    v, gate, up) is multiplied whole where the trace says the weights are split: its chunks of
    outputs would be dynamic slices along the split axis, which XLA gathers (the contrast: the
    same program traced as if unsplit)."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from swajax.memory.mesh_axis import AXIS
    from swajax.models import tensor_split
    from swajax.models.sharding import kv_mesh

    monkeypatch.setattr(layers, "CHUNK_BYTES", 64 * 128 * 2)  # 128 columns a chunk
    mesh = kv_mesh(2)
    rng = np.random.default_rng(5)
    w = jax.device_put(
        jnp.asarray(rng.standard_normal((64, 512)), jnp.bfloat16),
        NamedSharding(mesh, P(None, AXIS)),
    )
    x = jax.device_put(jnp.ones((2, 64), jnp.float32), NamedSharding(mesh, P()))

    def gathers(split):
        def product(x, w):
            with tensor_split.split_over_devices(split):
                return layers.dot(x, w)

        return jax.jit(product).lower(x, w).compile().as_text().count("all-gather")

    assert gathers(True) == 0
    assert gathers(False) > 0
