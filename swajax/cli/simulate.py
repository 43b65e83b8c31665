"""`swajax simulate`: parse, run `swajax.simulator`, print (and plot) both runs."""

from __future__ import annotations

import dataclasses

from swajax import sizing
from swajax.cli import args as args_lib
from swajax.simulator.run import simulate


def plot(result: dict, path: str) -> None:
    """Full and SWA pool occupancy per step for both runs (needs matplotlib: `.[plot]`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib: pip install -e '.[plot]'") from e
    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharey=True)
    for ax, name in zip(axes, ("hybrid", "single")):
        run = result[name]
        ax.plot(run.full_occupancy, label="full pool")
        if name == "hybrid":
            ax.plot(run.swa_occupancy, label="SWA pool")
        ax.set_title(f"{name}: peak {run.peak_concurrency} running requests")
        ax.set_ylabel("occupancy")
        ax.legend()
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path)


def run(args) -> int:
    import json

    cfg, budget = args_lib.model_config(args), sizing.gib_to_bytes(args.kv_budget_gib)
    timer = args_lib.step_timer(args, cfg, budget) if args.accelerator else None
    result = simulate(
        cfg,
        budget,
        timer=timer,
        cache_policy=args.cache_policy,
        tail_rebuild=args.tail_rebuild,
        draft=args_lib.draft_config(args),
        speculative_tokens=args.num_speculative_tokens,
        acceptance=args.acceptance,
        workload=args.workload,
        requests=args.requests,
        clients=args.clients,
        ratio=sizing.resolve_ratio(cfg, args.swa_full_tokens_ratio, 0.8),
        page_size=sizing.resolve_page_size(cfg, args.page_size, 16),
        seed=args.seed,
        dtype=args.dtype,
        progress=not args.json,
        host_cache_gib=args.host_cache_gib,
    )
    if not result["hybrid"].requests and not result["single"].requests:
        result["hybrid"].check_ran()  # nothing ran in either mode: an error naming the limit
    if args.plot:
        plot(result, args.plot)
    report = {k: v for k, v in result.items() if k not in ("hybrid", "single")}
    for name in ("hybrid", "single"):
        summary = dataclasses.asdict(result[name])
        del summary["full_occupancy"], summary["swa_occupancy"]
        report[name] = summary
    if args.json:
        print(json.dumps(report))
        return 0
    keys = [k for k in report["hybrid"] if k not in ("mode", "first_rejection")]
    print(f"{'':24}{'hybrid':>14}{'single pool':>14}")
    for k in keys:
        a, b = report["hybrid"][k], report["single"][k]
        if isinstance(a, list | tuple):  # (full, SWA) pairs: the host tier's figures
            a, b = (f"{x[0]:,}/{x[1]:,}" for x in (a, b))
            print(f"{k:24}{a:>14}{b:>14}")
            continue
        fmt = "{:>14.3f}" if isinstance(a, float) else "{:>14,}"
        print(f"{k:24}" + fmt.format(a) + fmt.format(b))
    print(f"peak concurrency hybrid / single: {report['peak_concurrency_ratio']:.2f}x")
    if args.accelerator:
        print(f"modeled tokens/s hybrid / single: {report['tokens_per_s_ratio']:.2f}x")
    if args.accelerator and args.clients:
        print(f"loaded tokens/s hybrid / single: {report['loaded_tokens_per_s_ratio']:.2f}x")
    return 0


def register(sub) -> None:
    from swajax.simulator.workloads import WORKLOADS

    p = sub.add_parser("simulate", help="run the null-model engine: hybrid pools vs one pool")
    args_lib.add_model_choice(p)
    p.add_argument("--kv-budget-gib", type=args_lib.BUDGET_GIB, required=True)
    p.add_argument("--host-cache-gib", type=args_lib.HOST_GIB, default=0.0)
    p.add_argument(
        "--swa-full-tokens-ratio",
        type=args_lib.RATIO,
        default=None,
        help="SWA / full, in (0, 1] (default 0.8; DeepSeek-V4: 0.1)",
    )
    p.add_argument(
        "--page-size", type=args_lib.PAGE_SIZE, default=None, help="default 16; DeepSeek-V4: 64"
    )
    p.add_argument(
        "--dtype",
        choices=sorted(sizing.DTYPE_BYTES),
        default="bf16",
        help="KV element type the pools are sized in (fp8_*: one byte)",
    )
    p.add_argument(
        "--workload",
        type=args_lib.workload_choice,
        required=True,
        help=f"{', '.join(WORKLOADS)}, or a JSON-lines file of "
        "{prompt_len, output_len, prefix_id?, arrival?}",
    )
    args_lib.add_timer_choice(p, required=False)
    args_lib.add_cache_policy(p)
    args_lib.add_emulated_speculation(p)
    p.add_argument("--requests", type=args_lib.MAX_REQUESTS, default=200)
    p.add_argument("--clients", type=args_lib.MAX_REQUESTS, default=None)
    p.add_argument("--seed", type=args_lib.SEED, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-compile-cache", action="store_true", help="compile everything afresh")
    p.add_argument(
        "--plot", type=args_lib.out_file(".png"), help="pool occupancy over steps (matplotlib)"
    )
    p.set_defaults(func=run)
