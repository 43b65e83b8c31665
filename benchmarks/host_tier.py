"""A host tier for the prefix cache against the device-only cache, with the null-model engine
(`swajax simulate`'s run) on workloads whose prefixes outlive the device KV budget.

    python benchmarks/host_tier.py [--presets gpt-oss-120b mimo-v2-flash] [--gib 1]
                                   [--multiples 1 4 16] [--accelerator h200]

Workloads: `document-chat` (4 documents of 8,192 tokens, 6 chats about each, 3 turns each, all
interleaved: a document's KV ages between its chats) and `multi-turn` (`swajax simulate`'s: 4-turn
chats over a shared system prompt). Rows, same pools and workload: the device-only cache without
and with the exact tail rebuild, then a host tier of 1x, 4x and 16x the device KV budget (tail
rebuild on). Columns: prefix hit rate, prefill tokens computed (and saved against the device-only
cache with rebuild), tokens loaded back from the host (full / SWA), steps, and modeled seconds on
the accelerator (`simulator/step_time.py`: the loads' bytes cross a 50 GB/s host link before
their step; saves overlap the compute).
"""

from __future__ import annotations

import argparse
import dataclasses

from swajax import sizing
from swajax.cli.args import model_cost
from swajax.presets import hf_preset, load_preset
from swajax.serving.options import EngineOptions
from swajax.simulator.run import run_workload
from swajax.simulator.step_time import ACCELERATORS, StepTimeModel
from swajax.simulator.workloads import document_chats, make_workload


def workloads(smoke: bool):
    if smoke:
        return {"document-chat": lambda: document_chats(1, 2, 2, 512)}
    return {
        "document-chat": lambda: document_chats(4, 6, 3, 8192),
        "multi-turn": lambda: make_workload("multi-turn", 96),
    }


def run(preset: str, gib: float, ratio: float, multiples, workload, args) -> list[tuple]:
    cfg = load_preset(preset)
    budget = sizing.gib_to_bytes(gib)
    sizes = sizing.size_hybrid(cfg, budget, ratio=ratio, page_size=16, dtype="bf16")
    timer = None
    if args.accelerator:
        timer = StepTimeModel(cfg, model_cost(hf_preset(preset)), ACCELERATORS[args.accelerator])
        timer = dataclasses.replace(timer, devices=timer.devices_needed(budget))
    cases = [("device, fallback", False, 0), ("device, rebuild", True, 0)]
    cases += [(f"host {m:g}x", True, m * gib) for m in multiples]
    rows = []
    for name, rebuild, host in cases:
        options = EngineOptions(
            max_running=args.max_running_requests,
            max_context=65_536,
            chunk_size=args.chunk,
            tail_rebuild=rebuild,
        )
        tiered = sizing.with_host_tier(sizes, cfg, host, "bf16")
        s = run_workload(cfg, tiered, workload(), options=options, progress=False, timer=timer)
        assert s.lost == 0, f"{name}: {s.lost} requests lost"
        rows.append((name, s))
    return rows


def main(argv=None) -> int | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["gpt-oss-120b", "mimo-v2-flash"])
    ap.add_argument("--gib", type=float, default=1.0, help="device KV budget")
    ap.add_argument("--swa-full-tokens-ratio", type=float, default=0.1)
    ap.add_argument("--multiples", type=float, nargs="+", default=[1, 4, 16])
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--max-running-requests", type=int, default=16)
    ap.add_argument("--accelerator", default="h200", help="modeled time ('' for none)")
    ap.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = ap.parse_args(argv)
    ratio = args.swa_full_tokens_ratio
    if args.smoke:
        args.presets, args.gib, args.multiples, args.chunk = ["gpt-oss-20b"], 0.2, [4], 512
    for preset in args.presets:
        for wname, workload in workloads(args.smoke).items():
            rows = run(preset, args.gib, args.swa_full_tokens_ratio, args.multiples, workload, args)
            base = rows[1][1].prefill_tokens
            print(f"\n{preset}, {wname}, device KV {args.gib:g} GiB, ratio {ratio}")
            print(
                f"{'':18}{'hit rate':>9}{'prefill':>12}{'saved':>8}{'loaded full/SWA':>20}"
                f"{'steps':>7}{'modeled s':>11}"
            )
            for name, s in rows:
                loaded = "{:,}/{:,}".format(*s.host_loaded_tokens)
                saved = 1 - s.prefill_tokens / max(base, 1)
                print(
                    f"{name:18}{s.prefix_hit_rate:>9.3f}{s.prefill_tokens:>12,}{saved:>8.1%}"
                    f"{loaded:>20}{s.steps:>7,}{s.modeled_seconds:>11.2f}"
                )


if __name__ == "__main__":
    main()
