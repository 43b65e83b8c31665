"""Memory at a published model's shapes: XLA's own `memory_analysis()` of what a step allocates
besides its inputs and outputs. gpt-oss-20b's head and embedding are 201,088 x 2880 in bfloat16
(1.1 GiB each); XLA:CPU, which has no bfloat16 product, once widened each to float32 whole in
every step (2.2 GiB apiece), so a 2-layer model's step held 2.5 GiB of temporaries and the
full-depth model was killed for memory on a 24 GB machine."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swajax.models.layers import dot, head_dot, lookup, tiled_dot

VOCAB, HIDDEN = 201_088, 2880
MIB = 2**20


def temp_bytes(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def one_product(x, w):
    """x @ w as one product of w's dtype, with no rows added: what XLA:CPU does unaided."""
    dims = (((1,), (0,)), ((), ()))
    return jax.lax.dot_general(x.astype(w.dtype), w, dims, preferred_element_type=jnp.float32)


@pytest.mark.parametrize("rows", [1, 16, 64])
def test_the_head_is_never_widened_whole(rows):
    x = jax.ShapeDtypeStruct((rows, HIDDEN), jnp.float32)
    head = jax.ShapeDtypeStruct((HIDDEN, VOCAB), jnp.bfloat16)
    assert temp_bytes(head_dot, x, head) < 128 * MIB  # whole: 2,209 MiB
    if rows == 1:  # a decode step's one row, unaided, for contrast: widened whole
        assert temp_bytes(one_product, x, head) > 2000 * MIB
    # A float16 head, which XLA:CPU widens at any batch, a tile at a time (a tile's slice and
    # its widened copy: 141 MiB on jax 0.12).
    head = jax.ShapeDtypeStruct((HIDDEN, VOCAB), jnp.float16)
    assert temp_bytes(head_dot, x, head) < 160 * MIB
    assert temp_bytes(one_product, x, head) > 2000 * MIB


@pytest.mark.parametrize("rows", [1, 16])
def test_a_tied_head_is_read_as_stored(rows):
    """Gemma 3 27B's head is its embedding, [262,208 x 5376] bfloat16 (2.6 GiB): read as stored,
    a tile at a time, not transposed whole first (a 2.8 GiB temporary in every step, measured
    through the engine with benchmarks/published_shapes.py)."""
    x = jax.ShapeDtypeStruct((rows, 5376), jnp.float32)
    table = jax.ShapeDtypeStruct((262_208, 5376), jnp.bfloat16)
    assert temp_bytes(lambda x, t: head_dot(x, t, vocab_first=True), x, table) < 256 * MIB


def test_a_wide_dense_weight_is_never_widened_whole():
    """Gemma 4 31B's MLP matrices, 5376 x 21504 (441 MiB each widened; 0.9 GiB of a step's
    temporaries at published widths): bfloat16 is multiplied as stored, float16 (widened by
    XLA:CPU) in 32 MiB column tiles."""
    for w in ((5376, 21504), (21504, 5376)):
        x = jax.ShapeDtypeStruct((1, w[0]), jnp.float32)
        for dtype in (jnp.bfloat16, jnp.float16):
            weight = jax.ShapeDtypeStruct(w, dtype)
            assert temp_bytes(dot, x, weight) < 96 * MIB
            assert temp_bytes(one_product, x, weight) > 400 * MIB


@pytest.mark.parametrize("e, h, f", [(16, 5120, 8192), (32, 2880, 2880)])
def test_routed_bfloat16_experts_widen_a_chunk_at_a_time(e, h, f):
    """Llama 4 Scout's experts, 16 x [5120 x 16384] and [8192 x 5120] bfloat16 (4 GiB a layer):
    a decode token's routed loop widens the chunk it reads, where XLA:CPU widened the whole
    stack ahead of the loop (7.5 GiB of temporaries, seen through the engine at one layer).
    gpt-oss-20b's widths in bfloat16 end in a shorter chunk, whose constant start once let the
    stack be widened whole again (3 GiB)."""
    from swajax.models import experts as X

    def routed(x, w1, w2, ids, weight):
        act = lambda g: jax.nn.silu(g[:, :f]) * g[:, f:]  # noqa: E731
        return X.routed(x, X.Routing(ids, None, weight), X.Experts(w1, None, w2, None), act)

    s = jax.ShapeDtypeStruct
    args = (
        s((1, h), jnp.bfloat16),
        s((e, h, 2 * f), jnp.bfloat16),
        s((e, f, h), jnp.bfloat16),
        s((1, 1), jnp.int32),
        s((1, 1), jnp.float32),
    )
    assert temp_bytes(routed, *args) < 64 * MIB


def test_a_lookup_in_a_loop_widens_only_the_rows():
    table = jax.ShapeDtypeStruct((VOCAB, HIDDEN), jnp.bfloat16)
    tokens = jax.ShapeDtypeStruct((16,), jnp.int32)

    def steps(table, tokens, lookup):
        def body(i, acc):  # as a multi-step round: a lookup per step
            return acc + lookup(table, (tokens + i) % VOCAB).astype(jnp.float32).sum()

        return jax.lax.fori_loop(0, 8, body, jnp.float32(0))

    ours = temp_bytes(lambda t, k: steps(t, k, lookup), table, tokens)
    plain = temp_bytes(lambda t, k: steps(t, k, lambda t, k: t[k]), table, tokens)
    assert ours < 16 * MIB
    if jax.__version_info__ < (0, 12):  # jax 0.12's XLA no longer widens the plain lookup
        assert 2000 * MIB < plain


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_tiles_give_the_plain_products_bits(dtype):
    """bfloat16 tiles give the whole product's bits; float16 ones its values (XLA:CPU widens
    float16 and blocks the widened product differently by its width)."""
    same = np.testing.assert_array_equal
    if dtype == jnp.float16:
        same = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    for vocab in (40_000, 40_960, 16_385 + 8192):  # uneven, even, just past one tile
        head = (rng.standard_normal((64, vocab)) * 0.1).astype(dtype)
        same(jax.jit(head_dot)(x, head), jax.jit(dot)(x, head))
        tied = jax.jit(lambda x, t: head_dot(x, t, vocab_first=True))(x, head.T)
        same(tied, jax.jit(dot)(x, head))
        tiles = jax.jit(lambda x, w: tiled_dot(x, w, 1000))(x[None], head)  # any leading dims
        same(tiles[0], jax.jit(dot)(x, head))
        one = jax.jit(head_dot)(x[:1], head)  # one row, given a zero companion on CPU
        np.testing.assert_allclose(one, jax.jit(dot)(x, head)[:1], rtol=1e-6, atol=1e-6)
    table = (rng.standard_normal((1000, 8))).astype(jnp.bfloat16)
    tokens = jnp.asarray([3, 999, 0, 3])
    np.testing.assert_array_equal(jax.jit(lookup)(table, tokens), table[np.asarray(tokens)])


@pytest.mark.slow
def test_a_published_size_layer_steps_within_its_bound(tmp_path):
    """One layer of gpt-oss-20b as the hub ships it (MXFP4 experts, bfloat16 elsewhere; 1.5 GiB
    written by benchmarks/published_shapes.py), loaded with the defaults: every step program's
    temporaries under 0.6 GiB (the KV pools and weights are its arguments), where they were 2.5
    GiB."""
    from helpers.published import shapes_module

    from swajax import LLM, SamplingParams

    shapes = shapes_module()
    shapes.write_gpt_oss(shapes.GPT_OSS_20B, tmp_path / "m", 1)
    llm = LLM(str(tmp_path / "m"), max_model_len=128, kv_budget_gib=0.1)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    with shapes.measuring_temporaries() as temps:
        llm.generate([[5, 6, 7, 8] * 4], params, use_tqdm=False)
    assert temps and max(t for _, t in temps) < 0.6 * 2**30, temps


def step_temporaries(layers: int) -> dict[str, int]:
    from helpers.published import step_programs

    programs = step_programs("auto", layers=layers)
    return {
        name: p.lower().compile().memory_analysis().temp_size_in_bytes
        for name, p in programs.items()
    }


def test_step_programs_at_published_widths_hold_little_besides_their_arguments():
    """gpt-oss-20b's widths in bfloat16, scanned (the default), as this CPU compiles them:
    prefill, decode, a multi-step round and a speculative round each allocate well under the
    size of one layer's weights (0.55 GiB) besides their arguments: no weight is widened or
    copied whole, no pool is copied (BUILD_NOTES.md, "Memory at published shapes"; at 24 layers
    they once held 2.3 GiB and the step was killed), and decoding copies no layer's attention
    weights out of the stack (the scan's slices of them made a decode step's temporaries 119
    MiB; 36 MiB without them; prefill and verify hold their rows' activations and logits)."""
    temps = step_temporaries(4)
    assert set(temps) == {"prefill", "decode", "round", "verify"}
    assert max(temps.values()) < 0.5 * 2**30, temps
    assert max(temps["decode"], temps["round"]) < 64 * MIB, temps


@pytest.mark.slow
def test_step_temporaries_do_not_grow_with_depth():
    shallow, deep = step_temporaries(4), step_temporaries(8)
    for name, size in deep.items():
        assert size <= shallow[name] + 16 * MIB, (name, size, shallow[name])


@pytest.mark.parametrize(
    "name, fixture",
    [("gemma-3-27b", "gemma3_vl"), ("tiny-mimo", None), ("llama-4-scout", "llama4")],
)
def test_the_writer_makes_checkpoints_the_loader_reads_whole(name, fixture, tmp_path):
    """benchmarks/published_shapes.py's writer, on configs small enough for a test (a fixture's,
    or a tiny preset): every tensor the decoder reads, under the hub's names (the text model
    inside a multimodal wrapper), and none besides; the engine generates from it."""
    import json

    from helpers import FIXTURES
    from helpers.published import shapes_module

    from swajax import LLM, SamplingParams

    config = json.loads((FIXTURES / fixture / "config.json").read_text()) if fixture else None
    shapes_module().write_model(name, tmp_path / "m", 2, config=config)
    names = json.loads((tmp_path / "m" / "model.safetensors.index.json").read_text())
    wrapped = name != "tiny-mimo"
    assert all(n.startswith("language_model.") for n in names["weight_map"]) == wrapped
    llm = LLM(str(tmp_path / "m"), kv_budget_gib=0.01)  # raises on a missing or stray tensor
    out = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=2, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 2
