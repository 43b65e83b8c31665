"""Capacity report: what a KV budget buys with hybrid pools versus one pool (`swajax plan`)."""

from __future__ import annotations

import argparse
import dataclasses

from swajax import sizing
from swajax.capacity import CapacityReport, capacity_report
from swajax.cli import args as args_lib


def format_report(report: CapacityReport) -> str:
    """A small human-readable table."""
    gib = 2**30
    rows = [
        ("model", f"{report.model_type} ({len(report.kinds)} layers: {report.kinds})"),
        ("window W", str(report.sliding_window)),
        ("pool mode", report.mode + (f", ratio {report.ratio:g}" if report.ratio else "")),
        ("page size / dtype", f"{report.page_size} / {report.dtype}"),
        ("full pool tokens", f"{report.full_tokens:,}"),
        ("SWA pool tokens", f"{report.swa_tokens:,}"),
        (
            "bytes/token full|SWA",
            f"{report.full_bytes_per_token:,} | {report.swa_bytes_per_token:,}",
        ),
        (
            "bytes used / budget",
            f"{report.bytes_used / gib:.3f} / {report.budget_bytes / gib:.3f} GiB",
        ),
        ("single-pool tokens", f"{report.single_pool_tokens:,}"),
        ("capacity vs single", f"{report.capacity_ratio:.2f}x"),
    ]
    if report.compressed_bytes_per_token:
        rows.append(("of which compressed", f"{report.compressed_bytes_per_token:,.1f} (full)"))
        rows.append(("of which pending", f"{report.pending_bytes_per_token:,.1f} (SWA)"))
    if report.device is not None:
        rows.insert(
            4, ("device / weights", f"{report.device} / {report.weight_bytes / 1e9:.1f} GB")
        )
    if report.host_full_tokens:
        host = f"{report.host_full_tokens:,} | {report.host_swa_tokens:,}"
        rows.append(("host tier tokens full|SWA", host))
    if report.min_ratio_estimate is not None:
        rows.append(("min ratio estimate", f"{report.min_ratio_estimate:.4f}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


# ---------------------------------------------------------------------------------------------
# The command


def run(args) -> int:
    import json

    cfg = args_lib.model_config(args)
    if args.workload is not None:
        return _run_planner(args, cfg)
    budget, device, weights = _budget(args)
    report = capacity_report(
        cfg,
        budget,
        ratio=sizing.resolve_ratio(cfg, args.swa_full_tokens_ratio, 0.8),
        page_size=sizing.resolve_page_size(cfg, args.page_size, 1),
        dtype=args.dtype,
        avg_seq_len=args.avg_seq_len,
        eviction_interval=args.eviction_interval,
        hybrid_memory=not args.disable_hybrid_swa_memory,
        draft=args_lib.draft_config(args),
        host_cache_gib=args.host_cache_gib,
    )
    report = dataclasses.replace(report, device=device, weight_bytes=weights)
    print(json.dumps(report.as_dict()) if args.json else format_report(report))
    return 0


USABLE = 0.9  # of a device's memory, as the step-time model's devices_needed assumes


def _budget(args) -> tuple[int, str | None, int | None]:
    """(KV budget bytes, device, weight bytes): --kv-budget-gib, or what `--devices` chips of
    `--accelerator` leave after the model's weights as loaded (`models.footprint`)."""
    if args.kv_budget_gib is not None:
        return sizing.gib_to_bytes(args.kv_budget_gib), None, None
    if args.accelerator is None:
        raise args_lib.UsageError(
            "give --kv-budget-gib, or --accelerator to use what the weights leave of its memory"
        )
    from swajax.simulator.step_time import ACCELERATORS

    cost = args_lib.model_cost(
        args_lib.raw_config(args), dequantize_weights=args.dequantize_weights
    )
    acc, n = ACCELERATORS[args.accelerator], args.devices or 1
    usable = n * acc.memory_bytes * USABLE
    if cost.weight_bytes >= usable:
        raise args_lib.UsageError(
            f"the weights take {cost.weight_bytes / 1e9:.1f} GB, more than the {usable / 1e9:.1f} "
            f"GB usable on {n} x {acc.name} ({USABLE:.0%}): give more --devices"
        )
    device = acc.name if n == 1 else f"{n} x {acc.name}"
    return int(usable - cost.weight_bytes), device, int(cost.weight_bytes)


def _run_planner(args, cfg) -> int:
    import json

    from swajax.simulator import ratio_planner
    from swajax.simulator.workloads import workload_of

    if args.accelerator is None:
        raise args_lib.UsageError("--workload plans by modeled step time: give --accelerator")
    budget = _budget(args)[0]
    timer = args_lib.step_timer(args, cfg, budget)
    chunks = ratio_planner.CHUNKS if args.chunk_size == "auto" else (int(args.chunk_size),)
    result = ratio_planner.plan(
        cfg,
        budget,
        lambda: workload_of(args.workload, args.requests, args.seed, clients=args.clients),
        timer,
        chunks=chunks,
        ratios=args.ratios or ratio_planner.RATIOS,
        page_size=sizing.resolve_page_size(cfg, args.page_size, 16),  # a serving page size
        dtype=args.dtype,
        host_cache_gib=args.host_cache_gib,
        loaded=args.clients is not None,
    )
    if args.plot:
        ratio_planner.plot(result, args.plot)
    print(json.dumps(result.as_dict()) if args.json else ratio_planner.format_plan(result))
    return 0


def _chunk(value: str) -> str:
    if value == "auto" or (value.isdigit() and int(value) >= 1):
        return value
    raise argparse.ArgumentTypeError(f"must be a positive integer or 'auto', got {value!r}")


def _ratios(value: str) -> tuple[float, ...]:
    try:
        return tuple(args_lib.RATIO(v) for v in value.split(","))
    except (argparse.ArgumentTypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"ratios in (0, 1], comma-separated: {e}") from None


def register(sub) -> None:
    p = sub.add_parser("plan", help="size the full and SWA pools for a KV budget")
    args_lib.add_model_choice(p)
    p.add_argument(
        "--kv-budget-gib",
        type=args_lib.BUDGET_GIB,
        help="in GiB (or --accelerator: what it leaves after the weights)",
    )
    p.add_argument(
        "--dequantize-weights",
        action="store_true",
        help="count quantized weights dequantized to bfloat16",
    )
    p.add_argument(
        "--swa-full-tokens-ratio",
        type=args_lib.RATIO,
        default=None,
        help="SWA / full, in (0, 1] (default 0.8; DeepSeek-V4: 0.1)",
    )
    p.add_argument("--host-cache-gib", type=args_lib.HOST_GIB, default=0.0)
    p.add_argument(
        "--page-size",
        type=args_lib.PAGE_SIZE,
        default=None,
        help="default 1 for capacity, 16 when planning a --workload; DeepSeek-V4: 64",
    )
    p.add_argument("--dtype", choices=sorted(sizing.DTYPE_BYTES), default="bf16")
    p.add_argument(
        "--avg-seq-len",
        type=args_lib.POSITIVE,
        metavar="T",
        help="average sequence length, for the minimum-ratio estimate",
    )
    p.add_argument(
        "--eviction-interval", type=args_lib.POSITIVE, default=sizing.DEFAULT_EVICTION_INTERVAL
    )
    p.add_argument(
        "--disable-hybrid-swa-memory",
        action="store_true",
        help="one pool for every layer (SWA layers still attend only their window)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args_lib.add_draft_choice(p)
    g = p.add_argument_group("planning by modeled step time (--workload)")
    g.add_argument(
        "--workload",
        type=args_lib.workload_choice,
        help="built-in workload or JSON-lines file to plan on",
    )
    args_lib.add_timer_choice(g, required=False)
    g.add_argument("--chunk-size", type=_chunk, default="8192", help="prefill chunk, or 'auto'")
    g.add_argument("--requests", type=args_lib.MAX_REQUESTS, default=48)
    g.add_argument("--clients", type=args_lib.MAX_REQUESTS, default=None)
    g.add_argument("--ratios", type=_ratios, help="comma-separated candidates (default: a grid)")
    g.add_argument("--seed", type=args_lib.SEED, default=0)
    g.add_argument("--plot", type=args_lib.out_file(".png"), help="throughput against the ratio")
    p.set_defaults(func=run)
