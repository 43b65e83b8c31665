"""Every attention implementation against the dense float64 oracle: one base class of cases,
one subclass per implementation (XLA; Pallas with the GPU front end and with the TPU front end,
both in interpret mode). Shapes stay small: interpret mode copies blocked inputs per grid step.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers.attention_case import check, jitted, make_case

from swajax.config import LayerKind, LayerSpec

LAYERS = {
    "full": LayerSpec(LayerKind.FULL),
    "sliding": LayerSpec(LayerKind.SLIDING, 8),
    "chunked": LayerSpec(LayerKind.CHUNKED, 8),
}


class AttentionCases:
    OPTIONS: dict = {}

    def run(self, case, layer, pages=None, sinks=None, **kw):
        k, v = pages or case.pages["swa" if layer.kind.is_local else "full"]
        return jitted(layer, **self.OPTIONS, **kw)(case.q, k, v, case.meta, sinks=sinks)

    @pytest.mark.parametrize("ps", [1, 4, 16])
    @pytest.mark.parametrize("kind", list(LAYERS))
    def test_decode(self, ps, kind):
        seq = sorted({1, max(ps - 1, 1), ps + 1, 7, 8, 9, 26})
        rng = np.random.default_rng(ps)
        case = make_case(rng, ps=ps, prefix=[s - 1 for s in seq], seq=seq)
        assert case.meta.block_q == 1
        check(case, LAYERS[kind], self.run(case, LAYERS[kind], scale=0.25), scale=0.25)

    @pytest.mark.parametrize("ps", [1, 4, 16])
    @pytest.mark.parametrize("kind", list(LAYERS))
    def test_extend(self, ps, kind):
        """Sequence lengths around page and window edges, with varied cached prefixes."""
        rng = np.random.default_rng(ps + 1)
        case = make_case(rng, ps=ps, prefix=[0, 5, 17, 3], seq=[26, 9, 40, 4])
        check(case, LAYERS[kind], self.run(case, LAYERS[kind], scale=0.25), scale=0.25)

    @pytest.mark.parametrize("hq, hkv", [(4, 4), (4, 2), (8, 1)])
    def test_gqa_sinks_soft_cap(self, hq, hkv):
        rng = np.random.default_rng(hq + hkv)
        sink = rng.normal(size=hq).astype(np.float32)
        for prefix, seq in (([9, 20], [10, 21]), ([0, 12], [20, 30])):  # decode, then extend
            case = make_case(rng, ps=4, prefix=prefix, seq=seq, hq=hq, hkv=hkv)
            for layer in (LAYERS["sliding"], LAYERS["full"]):
                out = self.run(case, layer, scale=0.3, sinks=jnp.asarray(sink), soft_cap=4.0)
                check(case, layer, out, scale=0.3, sinks=sink, soft_cap=4.0)

    @pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
    @pytest.mark.parametrize("kind", ["sliding", "full"])
    def test_fp8_pools(self, dtype, kind):
        """FP8 KV pools (the NaN filler of unused rows included): the float64 oracle applied
        to the very values the pools hold, dequantized, to float32 accuracy."""
        fp8 = getattr(jnp, dtype)
        rng = np.random.default_rng(11)
        for prefix, seq in (([8, 19, 3], [9, 20, 4]), ([0, 5], [26, 30])):  # decode, extend
            case = make_case(rng, ps=4, prefix=prefix, seq=seq, hq=4, hkv=2)
            pages = [p.astype(fp8) for p in case.pages["swa" if kind == "sliding" else "full"]]
            held = lambda x: np.asarray(jnp.asarray(x).astype(fp8).astype(jnp.float32))  # noqa: E731
            case.keys, case.values = [held(k) for k in case.keys], [held(v) for v in case.values]
            out = self.run(case, LAYERS[kind], pages=pages, scale=0.25)
            check(case, LAYERS[kind], out, scale=0.25)

    def test_deterministic(self):
        case = make_case(np.random.default_rng(4), ps=4, prefix=[0, 3], seq=[20, 4])
        a = self.run(case, LAYERS["sliding"], scale=0.2)
        b = self.run(case, LAYERS["sliding"], scale=0.2)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def test_garbage_independence(self):
        """Refilling unused pages, the dummy page and freed SWA slots with junk changes nothing."""
        case = make_case(np.random.default_rng(9), ps=4, prefix=[0, 40], seq=[12, 41])
        layer = LAYERS["sliding"]
        before = self.run(case, layer, scale=0.25)
        k, v = case.pages["swa"]
        used = set(np.asarray(case.meta.swa_page_table).ravel().tolist()) - {0}
        junk = np.array([p not in used for p in range(k.shape[0])])[:, None, None, None]
        junk_pages = (jnp.where(junk, 1e6, k), jnp.where(junk, -1e6, v))
        after = self.run(case, layer, pages=junk_pages, scale=0.25)
        np.testing.assert_array_equal(np.asarray(before), np.asarray(after))


class TestXla(AttentionCases):
    OPTIONS = dict(implementation="xla")

    @pytest.mark.parametrize("hq, hkv", [(4, 4), (4, 2), (8, 1)])
    @pytest.mark.parametrize("sinks, soft_cap", [(False, None), (True, None), (False, 5.0)])
    def test_gqa_sinks_soft_cap_separately(self, hq, hkv, sinks, soft_cap):
        rng = np.random.default_rng(hq * 10 + hkv)
        case = make_case(
            rng, ps=4, prefix=[0, 13, 30], seq=[20, 14, 31], hq=hq, hkv=hkv, dk=24, dv=8
        )
        sink = rng.normal(size=hq).astype(np.float32) if sinks else None
        for layer in (LAYERS["full"], LAYERS["sliding"]):
            out = self.run(
                case,
                layer,
                scale=0.3,
                sinks=None if sink is None else jnp.asarray(sink),
                soft_cap=soft_cap,
            )
            check(case, layer, out, scale=0.3, sinks=sink, soft_cap=soft_cap)

    def test_long_prefill_in_blocks(self):
        """Several query blocks per request, chunk boundaries inside blocks, a cached prefix."""
        case = make_case(np.random.default_rng(7), ps=4, prefix=[0, 50], seq=[150, 90], window=8)
        for layer in LAYERS.values():
            check(case, layer, self.run(case, layer, scale=0.25), scale=0.25)


class TestBatchInvariant(AttentionCases):
    OPTIONS = dict(implementation="xla", deterministic=True)

    @pytest.mark.parametrize("kind", list(LAYERS))
    def test_a_query_does_not_depend_on_its_batch(self, kind):
        """The same queries over the same KV, batched as a decode, as the tail of prefills of
        several lengths (other token counts, blocks and page-table widths): the same bits."""
        seq, hq = 70, 4
        queries = np.random.default_rng(5).normal(size=(seq, hq, 16)).astype(np.float32)
        outs = []
        for prefix in (69, 62, 38, 6, 0):
            case = make_case(np.random.default_rng(1), ps=4, prefix=[prefix], seq=[seq])
            q = np.zeros((case.meta.num_tokens, hq, 16), np.float32)
            q[: seq - prefix] = queries[prefix:]
            k, v = case.pages["swa" if LAYERS[kind].kind.is_local else "full"]
            out = jitted(LAYERS[kind], **self.OPTIONS, scale=0.25)(jnp.asarray(q), k, v, case.meta)
            outs.append(np.asarray(out)[seq - prefix - 1])
        for out in outs[1:]:
            np.testing.assert_array_equal(out, outs[0])

    def test_not_with_the_kernels(self):
        case = make_case(np.random.default_rng(4), ps=4, prefix=[0], seq=[8])
        run = jitted(LAYERS["full"], implementation="pallas", deterministic=True, scale=0.2)
        with pytest.raises(ValueError, match="XLA implementation only"):
            run(case.q, *case.pages["full"], case.meta)


class TestPallasGpuInterpret(AttentionCases):
    OPTIONS = dict(implementation="pallas", interpret=True, backend="gpu")


class TestPallasTpuInterpret(AttentionCases):
    OPTIONS = dict(implementation="pallas", interpret=True, backend="tpu")
