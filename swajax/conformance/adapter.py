"""The adapter protocol a backend implements to run the kit, and swajax's own adapter.

    class MyAdapter:
        def allocator_and_cache(self, header: dict) -> tuple[allocator, prefix_cache]: ...
        def attention(self, case: dict[str, np.ndarray]) -> np.ndarray: ...   # [T, Hq, Dv]
        def logits(self, model_dir: str, prompt: list[int]) -> np.ndarray: ...  # [len, vocab]

`allocator_and_cache` gets an operation case's trace header (pool sizes, page size, mode,
window, leaf cap) and returns objects with swajax's method names (see README "Trace record and
replay"); pages may be numbered and handed out in any order. `attention` gets an attention
case's arrays (see `attention_cases.py`). A method may raise NotImplementedError: its cases are
reported as skipped, not failed.
"""

from __future__ import annotations

import dataclasses

import numpy as np


class SwajaxAdapter:
    """swajax itself: its allocator and prefix cache, its attention (XLA path, or the Pallas
    kernels in interpret mode with `implementation="pallas"`), its engine for logits."""

    implementation = "xla"

    def allocator_and_cache(self, header: dict):
        from swajax.trace.replay import swajax_backend

        return swajax_backend(header)

    def attention(self, case: dict) -> np.ndarray:
        import functools

        import jax
        import jax.numpy as jnp

        from swajax.attention import attention, build_metadata
        from swajax.config import LayerKind, LayerSpec
        from swajax.memory import allocator as A, req_to_token as R

        table, prefix, seq = case["page_table"], case["prefix_lens"], case["seq_lens"]
        kind, window = LayerKind(str(case["kind"])), int(case["window"])
        ps = case["k_pages"].shape[1]
        n, width = table.shape
        # The case gives the layer's own pool pages. swajax addresses tokens by full slots and
        # derives the SWA ones: give each position a full slot of its own and point it at the
        # case's page (a freed page, 0, stays untranslated).
        full_size = n * width * ps
        pool_slots = table[:, :, None] * ps + np.arange(ps)  # [R, NP, ps]
        pool_slots = np.where(table[:, :, None] > 0, pool_slots, 0).reshape(n, -1)
        full_slots = (np.arange(n * width * ps).reshape(n, -1) + ps).astype(np.int32)
        local = kind.is_local
        mode = "hybrid" if local else "single"
        pool_rows = case["k_pages"].shape[0] * ps - ps
        state = A.init_allocator(full_size, pool_rows if local else full_size, ps, mode)
        if local:
            mapping = np.zeros(state.full_to_swa.shape, np.int32)
            mapping[full_slots.reshape(-1)] = pool_slots.reshape(-1)
            state = dataclasses.replace(state, full_to_swa=jnp.asarray(mapping))
            slots = full_slots
        else:  # full layers read their own slots directly
            slots = pool_slots
        r2t = R.ReqToToken.init(n, width * ps)
        rows = np.arange(n)
        r2t = R.write(
            r2t,
            rows,
            np.zeros(n, np.int32),
            seq,
            jnp.asarray(np.concatenate([slots[r, : seq[r]] for r in range(n)]), jnp.int32),
        )
        meta = build_metadata(r2t, state, rows, prefix, seq, window=window if local else 0)
        q = case["q"]  # the metadata pads the batch's tokens to a bucket
        q = np.concatenate([q, np.zeros((meta.num_tokens - len(q), *q.shape[1:]), q.dtype)])
        # One program per case: run eagerly, the implementation's every op (and every body of
        # its maps) would compile on its own, hundreds of tiny programs.
        run = jax.jit(
            functools.partial(
                attention,
                layer=LayerSpec(kind, window if local else None),
                scale=float(case["scale"]),
                soft_cap=float(case["soft_cap"]) if "soft_cap" in case else None,
                implementation=self.implementation,
                interpret=self.implementation == "pallas",
            )
        )
        sinks = jnp.asarray(case["sinks"]) if "sinks" in case else None
        out = run(
            jnp.asarray(q),
            jnp.asarray(case["k_pages"]),
            jnp.asarray(case["v_pages"]),
            meta,
            sinks=sinks,
        )
        return np.asarray(out, np.float64)[: len(case["q"])]

    def logits(self, model_dir: str, prompt: list[int]) -> np.ndarray:
        from swajax.api import EngineSpec, make_engine, teacher_forced_logits
        from swajax.models import load_decoder

        engine = make_engine(
            load_decoder(model_dir), EngineSpec.of(kv_budget_gib=0.01, max_context=4096)
        )
        return teacher_forced_logits(engine, prompt)


class SwajaxPallasAdapter(SwajaxAdapter):
    implementation = "pallas"
