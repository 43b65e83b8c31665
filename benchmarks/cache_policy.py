"""Each cache-policy rule's effect, measured with the null-model engine (`swajax simulate`'s
run): the swajax profile, each SGLang 0.5.23 rule alone on top of it, and the whole
sglang-0.5.23 profile, on the multi-turn and long-context workloads, same budget, same run.

    python benchmarks/cache_policy.py [--preset gpt-oss-20b] [--gib 0.5] [--requests 32]

Columns: prefix hit rate (hit / admitted tokens), SWA-tail miss tokens (cached full KV cut by
the window rule, hence recomputed), mean SWA-pool occupancy, steps, retractions.
"""

from __future__ import annotations

import argparse
import dataclasses

from swajax import sizing
from swajax.prefix_cache.policy import SGLANG_0_5_23, SWAJAX, CachePolicy
from swajax.presets import load_preset
from swajax.serving.options import EngineOptions
from swajax.simulator.run import run_workload
from swajax.simulator.workloads import make_workload


def policies():
    yield SWAJAX
    for rule in CachePolicy.RULES:
        yield dataclasses.replace(SWAJAX, name=f"+{rule}", **{rule: True})
    yield SGLANG_0_5_23


def main(argv=None) -> int | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt-oss-20b")
    ap.add_argument("--gib", type=float, default=0.5)
    ap.add_argument("--swa-full-tokens-ratio", type=float, default=0.3)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--workloads", default="multi-turn,long-context")
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = ap.parse_args(argv)
    ratio = args.swa_full_tokens_ratio
    if args.smoke:
        args.requests, args.workloads = 2, "multi-turn"
    cfg = load_preset(args.preset)
    sizes = sizing.size_hybrid(
        cfg,
        sizing.gib_to_bytes(args.gib),
        ratio=args.swa_full_tokens_ratio,
        page_size=16,
        dtype="bf16",
    )
    print(
        f"{args.preset}, {args.gib} GiB, ratio {ratio}: full {sizes.full_tokens:,} / "
        f"SWA {sizes.swa_tokens:,} tokens, page 16, chunk {args.chunk}"
    )
    for workload in args.workloads.split(","):
        print(f"\n{workload}, {args.requests} requests")
        print(
            f"{'policy':32}{'hit rate':>9}{'tail miss':>11}{'SWA occ':>9}{'steps':>7}{'retract':>9}"
        )
        for policy in policies():
            options = EngineOptions(
                max_running=64, max_context=33_792, chunk_size=args.chunk, cache_policy=policy
            )
            run = run_workload(
                cfg,
                sizes,
                make_workload(workload, args.requests, 0),
                options=options,
                progress=False,
            )
            occ = sum(run.swa_occupancy) / max(len(run.swa_occupancy), 1)
            assert run.lost == 0
            print(
                f"{policy.name:32}{run.prefix_hit_rate:>9.3f}{run.swa_tail_miss_tokens:>11,}"
                f"{occ:>9.3f}{run.steps:>7}{run.retractions:>9}"
            )


if __name__ == "__main__":
    main()
