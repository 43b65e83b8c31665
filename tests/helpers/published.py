"""The engine's step programs at a published model's shapes, without its weights.

The decoder is built as shapes only (`nnx.eval_shape`), so gpt-oss-20b's real widths cost no
memory; the engine schedules requests as usual, and each program it launches is recorded with
its arguments instead of run (the engine gets zeros of the right shapes back, and its ledger
check, which compares with the device's free counts, is skipped). The records lower for any
platform (`swajax.platform.lowering_for`) or compile for this one.
"""

from __future__ import annotations

import functools
import importlib.util

from flax import nnx

from helpers import ROOT


@functools.cache
def shapes_module():
    """benchmarks/published_shapes.py: the published configs and the checkpoint writer."""
    spec = importlib.util.spec_from_file_location(
        "published_shapes", ROOT / "benchmarks" / "published_shapes.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def published_config(name: str = "gpt-oss-20b", layers: int | None = None) -> dict:
    cfg = dict(shapes_module().MODELS[name])
    if layers is not None:
        kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        cfg.update(num_hidden_layers=layers, layer_types=kinds)
    return cfg


def narrowed_config(layers: int = 2) -> dict:
    """gpt-oss-20b's layer kinds, head width (64) and experts' routing over narrow layers and a
    small vocabulary: its programs compile for TPU in seconds, not minutes."""
    cfg = published_config(layers=layers)
    cfg.update(
        hidden_size=256,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
        num_local_experts=4,
    )
    return cfg


def abstract_decoder(cfg: dict, dtype: str = "bfloat16"):
    from swajax.models.decoder import decoder_for
    from swajax.models.loading import decoder_spec

    spec = decoder_spec(cfg, dtype=dtype)
    return nnx.eval_shape(lambda: decoder_for(spec))


def step_programs(
    attention: str = "auto",
    layers: int = 4,
    deterministic: bool = False,
    kv_budget_gib: float = 0.05,
) -> dict:
    """prefill, decode, round (multi-step decode) and verify (a speculative round with a 2-layer
    draft of the same shapes), as traced for the current target platform."""
    from swajax import SamplingParams
    from swajax.api.engine_spec import EngineSpec, make_engine
    from swajax.runner import program_store

    target = abstract_decoder(published_config(layers=layers))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    base = dict(
        attention=attention,
        kv_budget_gib=kv_budget_gib,
        max_context=512,
        chunk_size=64,
        deterministic=deterministic,
    )
    runs = {
        "plain": (dict(decode_steps=1), None),
        "round": (dict(decode_steps=4), None),
        "verify": (dict(num_speculative_tokens=2), published_config(layers=2)),
    }
    out = {}
    for name, (options, draft_cfg) in runs.items():
        draft = None if draft_cfg is None else abstract_decoder(draft_cfg)
        calls: list = []
        with program_store.recording(calls):
            engine = make_engine(target, EngineSpec.of(**base, **options), draft)
            engine.add_request(list(range(3, 40)), params)
            engine.run()
        names = [c.fn.__name__ for c in calls]
        if name == "plain":
            out["prefill"], out["decode"] = calls[0], calls[names.index("fused_step", 1)]
        else:
            out[name] = calls[names.index(f"fused_{name}")]
    return out
