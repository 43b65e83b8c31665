"""`swajax compile-check`: does a model compile and fit on a TPU chip (no TPU, no weights read).

Exit status 0: every program compiled and the largest fits the chip's HBM; 1: it does not fit
(the weights, or the compiler's own out-of-memory message); 2: bad input or no TPU compiler.
"""

from __future__ import annotations

import json
import sys

from swajax import presets
from swajax.cli import args as args_lib

GIB = 2**30


def format_report(report) -> str:
    rows = [
        (
            "model / slice",
            f"{report.model} on {report.slice} ({report.device_kind}"
            + (")" if report.chips == 1 else f", split over {report.chips} chips): per chip"),
        ),
        ("weights", f"{report.weight_bytes / GIB:.2f} GiB"),
        (
            "pools",
            f"{report.full_tokens:,} full + {report.swa_tokens:,} SWA tokens "
            f"(page {report.page_size}), {report.pool_bytes / GIB:.2f} GiB; "
            f"{report.full_tokens // report.max_context} request(s) of "
            f"{report.max_context:,} tokens at once",
        ),
    ]
    for p in report.programs:
        rows.append(
            (
                f"{p.name} x{p.rows}",
                f"args {p.argument_bytes / GIB:.2f} + temp {p.temp_bytes / GIB:.2f} GiB "
                f"= {p.peak_bytes / GIB:.2f} GiB; compiled in {p.compile_seconds:.0f} s",
            )
        )
        if p.name == "decode":
            rows.append(
                (
                    "",
                    f"modeled (XLA's TPU cost model): {p.bytes_accessed / 1e9:.2f} GB "
                    f"accessed, {p.bandwidth_seconds * 1e3:.2f} ms at HBM bandwidth"
                    + ("" if p.xla_seconds is None else f", XLA: {p.xla_seconds * 1e3:.2f} ms")
                    + f"; every weight read once: {report.roofline_seconds(p.rows) * 1e3:.2f} ms",
                )
            )
    verdict = "fits" if report.fits else "does NOT fit"
    rows.append(
        (
            "peak / HBM",
            f"{report.peak_bytes / GIB:.2f} / {report.hbm_bytes / GIB:.0f} GiB: {verdict}",
        )
    )
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def run(args) -> int:
    from swajax.api.compile_check import DoesNotFit, compile_check

    if args.model is not None:  # a checkpoint folder or a hub id in the local cache
        if args.preset is not None or args.hf_config is not None:
            raise args_lib.UsageError("give one of --model, --preset or --hf-config")
        from swajax.api.hub import resolve_model
        from swajax.models.loading import read_config

        raw, name = read_config(resolve_model(args.model, flag="--model")), args.model
    else:
        args_lib.model_config(args)  # --preset or --hf-config, validated
        raw, name = args_lib.raw_config(args), args.preset or args.hf_config
    try:
        cfg = presets.at_depth(raw, args.layers)
    except ValueError as e:
        raise args_lib.UsageError(f"--layers: {e}") from None
    try:
        report = compile_check(
            cfg,
            args.slice,
            name=name,
            memory_fraction=args.memory_fraction,
            ratio=args.swa_full_tokens_ratio,
            max_context=args.context_length,
            page_size=args.page_size,
            batch=args.batch,
            warm_up=args.warm_up,
        )
    except DoesNotFit as e:
        if args.json:
            print(json.dumps({"model": name, "slice": args.slice, "fits": False, "error": str(e)}))
        print(f"swajax compile-check: {e}", file=sys.stderr)
        return 1
    print(json.dumps(report.as_dict()) if args.json else format_report(report))
    return 0 if report.fits else 1


def register(sub) -> None:
    p = sub.add_parser(
        "compile-check", help="compile a model's step programs for a TPU chip: does it fit?"
    )
    args_lib.add_model_choice(p)
    p.add_argument(
        "--model", metavar="DIR|ORG/NAME", help="a checkpoint folder or a hub id in the local cache"
    )
    p.add_argument("--slice", required=True, help="a Cloud TPU slice: v5e-1, v6e-1, v5p-2")
    p.add_argument("--layers", type=args_lib.POSITIVE, help="check the first N layers only")
    p.add_argument(
        "--memory-fraction",
        type=float,
        default=0.9,
        help="of the chip's HBM for weights, pools and the steps' temporaries (default 0.9)",
    )
    p.add_argument(
        "--swa-full-tokens-ratio",
        type=args_lib.RATIO,
        default=None,
        help="SWA / full pool tokens (default: the model's, else 0.5)",
    )
    p.add_argument(
        "--context-length",
        type=args_lib.POSITIVE,
        default=32768,
        help="tokens one request may hold (default 32768)",
    )
    p.add_argument("--page-size", type=args_lib.PAGE_SIZE, default=None)
    p.add_argument(
        "--batch",
        type=args_lib.POSITIVE,
        default=64,
        help="decode also compiled at this many requests (default 64)",
    )
    p.add_argument(
        "--warm-up",
        action="store_true",
        help="also compile every step program a server's warm-up makes (each fixed shape)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)
