"""DeepSeek-V4-Flash at a KV budget: what the third lifetime buys, and modeled throughput.

    python benchmarks/compressed_capacity.py [--gib 40] [--markdown]

Token capacity (bf16, page size 64, ratio 0.1: SGLang's override for the model) of
  - swajax's pools: compressed entries on the full pages, window KV and pending compressor
    projections in the SWA pool (`memory/compressed_pool.py`);
  - two pools without the compressed lifetime: CSA / HCA layers kept as full-attention layers
    (their whole KV for the whole request), window-only layers in the SWA pool;
  - one pool holding every layer's full KV (K = V, 1 KiB per layer-token) and the entries;
  - swajax with hybrid memory off (one pool: every token keeps its window KV and pending rows).
Then the modeled decode throughput of `swajax plan --workload` on an H200 (16 requests of
each built-in workload) at the planned ratio against one pool. Arithmetic and the null-model
simulator: no device is touched.
"""

from __future__ import annotations

import argparse
import dataclasses

from swajax import sizing
from swajax.cli.args import model_cost
from swajax.config import LayerKind
from swajax.presets import hf_preset, load_preset
from swajax.simulator import ratio_planner
from swajax.simulator.step_time import ACCELERATORS, StepTimeModel
from swajax.simulator.workloads import workload_of

PRESET, RATIO, PAGE, DTYPE = "deepseek-v4-flash", 0.1, 64, "bf16"


def _as_full(cfg, layer_ids):
    """`cfg` with the given layers as full-attention layers without compression."""
    layers = list(cfg.layers)
    for i in layer_ids:
        layers[i] = dataclasses.replace(
            layers[i],
            kind=LayerKind.FULL,
            window=None,
            compress_rate=None,
            compress_dims=0,
            pending_dims=0,
            compress_topk=0,
        )
    full = dataclasses.replace(cfg.full_attention, **_shape_fields(cfg.swa_attention))
    return dataclasses.replace(cfg, layers=tuple(layers), full_attention=full)


def _shape_fields(shape):
    return {f.name: getattr(shape, f.name) for f in dataclasses.fields(shape)}


def capacities(gib: float) -> dict[str, int]:
    cfg, budget = load_preset(PRESET), sizing.gib_to_bytes(gib)
    kw = dict(page_size=PAGE, dtype=DTYPE)
    two_pools = _as_full(cfg, cfg.compressed_layer_ids)
    every_layer = _as_full(cfg, range(cfg.num_layers))
    entries = cfg.compressed_bytes_per_token(sizing.compressed_dtype_bytes(DTYPE), PAGE)
    full_kv = sizing.token_bytes(every_layer, DTYPE)[0] + entries
    return {
        "swajax, three lifetimes": sizing.size_hybrid(cfg, budget, ratio=RATIO, **kw).full_tokens,
        "two pools, compressed layers as full": sizing.size_hybrid(
            two_pools, budget, ratio=RATIO, **kw
        ).full_tokens,
        "one pool, every layer's full KV": budget // int(full_kv) // PAGE * PAGE,
        "swajax, hybrid memory off": sizing.size_single_pool(cfg, budget, **kw).full_tokens,
    }


def throughput(gib: float, requests: int, workloads) -> list[tuple[str, float, float, float]]:
    cfg, budget = load_preset(PRESET), sizing.gib_to_bytes(gib)
    timer = StepTimeModel(cfg, model_cost(hf_preset(PRESET)), ACCELERATORS["h200"])
    timer = dataclasses.replace(timer, devices=timer.devices_needed(budget))
    rows = []
    for workload in workloads:
        result = ratio_planner.plan(
            cfg, budget, lambda w=workload: workload_of(w, requests, 0), timer, page_size=PAGE
        )
        rows.append(
            (workload, result.best.ratio, result.best.tokens_per_s, result.single.tokens_per_s)
        )
    return rows


def main(argv=None) -> int | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=40.0)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--smoke", action="store_true", help="one short workload")
    a = p.parse_args(argv)
    caps = capacities(a.gib)
    ours = caps["swajax, three lifetimes"]
    print(f"DeepSeek-V4-Flash, {a.gib:g} GiB of KV, {DTYPE}, page {PAGE}, ratio {RATIO}")
    for name, tokens in caps.items():
        line = (name, f"{tokens:,}", f"{ours / tokens:.2f}x")
        print("| " + " | ".join(line) + " |" if a.markdown else "  ".join(line))
    workloads = ("multi-turn",) if a.smoke else ("long-context", "multi-turn", "reasoning")
    requests = 4 if a.smoke else a.requests
    for workload, ratio, hybrid, one in throughput(a.gib, requests, workloads):
        line = (
            workload,
            f"ratio {ratio:g}",
            f"{hybrid:,.0f} tok/s",
            f"one pool {one:,.0f}",
            f"{hybrid / one:.2f}x",
        )
        print("| " + " | ".join(line) + " |" if a.markdown else "  ".join(line))


if __name__ == "__main__":
    main()
