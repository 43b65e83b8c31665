"""The `swajax` command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence

from swajax import presets, sizing
from swajax.cli import plan
from swajax.config import ConfigError, HybridConfig, load_hf_config


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit status 2."""


def _model_config(args: argparse.Namespace) -> HybridConfig:
    if (args.preset is None) == (args.hf_config is None):
        raise UsageError("give exactly one of --preset NAME or --hf-config PATH")
    if args.preset is not None:
        try:
            return presets.load_preset(args.preset)
        except KeyError as e:
            raise UsageError(e.args[0]) from e
    return load_hf_config(args.hf_config)


def _cmd_plan(args: argparse.Namespace) -> int:
    cfg = _model_config(args)
    report = plan.capacity_report(
        cfg,
        sizing.gib_to_bytes(args.kv_budget_gib),
        ratio=sizing.check_ratio(args.ratio),
        page_size=args.page_size,
        dtype=args.dtype,
        avg_seq_len=args.avg_seq_len,
        eviction_interval=args.eviction_interval,
        hybrid_memory=not args.disable_hybrid_memory,
    )
    print(json.dumps(report.as_dict()) if args.json else plan.format_report(report))
    return 0


def _add_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="size the full and SWA pools for a KV budget")
    p.add_argument(
        "--preset",
        choices=None,
        metavar="NAME",
        help=f"built-in model: {', '.join(presets.preset_names())}",
    )
    p.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json (or its folder)")
    p.add_argument("--kv-budget-gib", type=float, required=True, help="bytes for KV, in GiB")
    p.add_argument("--ratio", type=float, default=0.8, help="SWA / full token ratio, in (0, 1]")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--dtype", choices=sorted(sizing.DTYPE_BYTES), default="bf16")
    p.add_argument(
        "--avg-seq-len",
        type=int,
        metavar="T",
        help="average sequence length, for the minimum-ratio estimate",
    )
    p.add_argument("--eviction-interval", type=int, default=sizing.DEFAULT_EVICTION_INTERVAL)
    p.add_argument(
        "--disable-hybrid-memory",
        action="store_true",
        help="one pool for every layer (SWA layers still attend only their window)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_plan)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from swajax.cli.simulate import plot, simulate

    if args.requests < 1:
        raise UsageError(f"--requests must be >= 1, got {args.requests}")
    result = simulate(
        _model_config(args),
        sizing.gib_to_bytes(args.kv_budget_gib),
        workload=args.workload,
        requests=args.requests,
        ratio=sizing.check_ratio(args.ratio),
        page_size=args.page_size,
        seed=args.seed,
        progress=not args.json,
    )
    if args.plot:
        plot(result, args.plot)
    report = {k: v for k, v in result.items() if k not in ("hybrid", "single")}
    for name in ("hybrid", "single"):
        run = dataclasses.asdict(result[name])
        del run["full_occupancy"], run["swa_occupancy"]
        report[name] = run
    if args.json:
        print(json.dumps(report))
        return 0
    keys = [k for k in report["hybrid"] if k != "mode"]
    print(f"{'':24}{'hybrid':>14}{'single pool':>14}")
    for k in keys:
        a, b = report["hybrid"][k], report["single"][k]
        fmt = "{:>14.3f}" if isinstance(a, float) else "{:>14,}"
        print(f"{k:24}" + fmt.format(a) + fmt.format(b))
    print(f"peak concurrency hybrid / single: {report['peak_concurrency_ratio']:.2f}x")
    return 0


def _add_simulate(sub: argparse._SubParsersAction) -> None:
    from swajax.serving.workloads import WORKLOADS

    p = sub.add_parser("simulate", help="run the null-model engine: hybrid pools vs one pool")
    p.add_argument("--preset", metavar="NAME", help=f"one of: {', '.join(presets.preset_names())}")
    p.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json (or its folder)")
    p.add_argument("--kv-budget-gib", type=float, required=True)
    p.add_argument("--ratio", type=float, default=0.8)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--workload", choices=WORKLOADS, required=True)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", metavar="FILE.png", help="pool occupancy over steps (matplotlib)")
    p.set_defaults(func=_cmd_simulate)


def _cmd_convert(args: argparse.Namespace) -> int:
    from swajax.models import load_decoder, save_orbax

    save_orbax(load_decoder(args.source), args.source, args.out)
    print(f"wrote {args.out}")
    return 0


def _add_convert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="save a Hugging Face checkpoint's params as orbax")
    p.add_argument("source", metavar="DIR", help="config.json + *.safetensors")
    p.add_argument("out", metavar="OUT", help="output folder (config.json + params/)")
    p.set_defaults(func=_cmd_convert)


def _setup(args: argparse.Namespace):
    from swajax.cli.generate import Setup

    return Setup(
        kv_budget_gib=args.kv_budget_gib,
        ratio=sizing.check_ratio(args.ratio),
        page_size=args.page_size,
        hybrid_memory=not args.disable_hybrid_memory,
        prefix_cache=not args.no_prefix_cache,
        attention=args.attention,
    )


def _prompts(args: argparse.Namespace, tokenizer) -> list[list[int]]:
    from swajax.cli.generate import read_prompts_file

    given = [x is not None for x in (args.prompt, args.prompt_ids, args.prompts_file)]
    if sum(given) > 1:
        raise UsageError("give one of --prompt, --prompt-ids, --prompts-file")
    if args.prompts_file:
        return read_prompts_file(args.prompts_file, tokenizer)
    if args.prompt_ids:
        try:
            return [[int(t) for t in args.prompt_ids.split(",")]]
        except ValueError as e:
            raise UsageError(f"--prompt-ids must be comma-separated integers: {e}") from e
    return [tokenizer.encode(args.prompt if args.prompt is not None else "Sliding windows")]


def _cmd_generate(args: argparse.Namespace) -> int:
    from swajax.cli.generate import generate, load, make_engine
    from swajax.serving.request import SamplingParams

    decoder, tokenizer = load(args.model)
    prompts = _prompts(args, tokenizer)
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )
    reqs, summary = generate(make_engine(decoder, _setup(args)), prompts, params)
    for prompt, req in zip(prompts, reqs):
        text = tokenizer.decode(req.output)
        if args.json:
            print(
                json.dumps(
                    dict(
                        prompt_ids=prompt,
                        tokens=req.output,
                        logprobs=req.logprobs,
                        text=text,
                        finish_reason=req.finish_reason,
                    )
                )
            )
        else:
            shown = f" {text!r}" if text is not None else ""
            print(f"[{len(prompt)} prompt tokens] -> {req.output}{shown}")
    if args.json:
        print(json.dumps(dict(summary=summary)))
    else:
        print(
            f"memory: peak full {summary['peak_full_used']}/{summary['full_tokens']} tokens, "
            f"peak SWA {summary['peak_swa_used']}/{summary['swa_tokens']}, prefix hits "
            f"{summary['prefix_hit_tokens']}, SWA KV freed {summary['swa_freed_tokens']} tokens"
        )
    return 0


def _cmd_logits(args: argparse.Namespace) -> int:
    import numpy as np

    from swajax.cli.generate import load, make_engine, teacher_forced_logits

    decoder, tokenizer = load(args.model)
    prompt = _prompts(args, tokenizer)[0]
    logits = teacher_forced_logits(make_engine(decoder, _setup(args)), prompt)
    np.save(args.out, logits)
    print(f"wrote {args.out}: logits {logits.shape}")
    return 0


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="'tiny' (embedded) or a checkpoint folder")
    p.add_argument("--prompt", help="text (needs the checkpoint's tokenizer.json)")
    p.add_argument("--prompt-ids", help="comma-separated token ids")
    p.add_argument("--prompts-file", help="JSON lines with 'prompt' or 'prompt_ids'")
    p.add_argument("--attention", choices=("xla", "pallas"), default="xla")
    p.add_argument("--kv-budget-gib", type=float, default=0.004)
    p.add_argument("--ratio", type=float, default=0.5)
    p.add_argument("--page-size", type=int, default=4)
    p.add_argument("--disable-hybrid-memory", action="store_true")
    p.add_argument("--no-prefix-cache", action="store_true")


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate tokens through the engine")
    _add_model_args(p)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_generate)
    p = sub.add_parser("logits", help="teacher-forced logits of a prompt, through the engine")
    _add_model_args(p)
    p.add_argument("--out", required=True, help="FILE.npy")
    p.set_defaults(func=_cmd_logits)


def _cmd_record(args: argparse.Namespace) -> int:
    from swajax.cli.simulate import run_workload
    from swajax.cli.trace import Tracer
    from swajax.serving.engine import EngineOptions

    cfg = _model_config(args)
    sizes = sizing.size_hybrid(
        cfg,
        sizing.gib_to_bytes(args.kv_budget_gib),
        ratio=sizing.check_ratio(args.ratio),
        page_size=args.page_size,
        dtype="bf16",
    )
    if not cfg.sliding_window:
        raise UsageError(f"{cfg.model_type} has no sliding layers: nothing hybrid to record")
    tracers = []
    options = EngineOptions(max_running=64, max_context=33_792, chunk_size=args.chunk_size)
    run_workload(
        cfg,
        sizes,
        args.workload,
        args.requests,
        seed=args.seed,
        options=options,
        progress=False,
        on_engine=lambda e: tracers.append(Tracer(e)),
    )
    tracers[0].write(args.out)
    print(f"wrote {len(tracers[0].lines)} lines to {args.out}")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from swajax.cli.trace import replay

    result = replay(args.trace)
    if args.json:
        print(json.dumps(result))
    elif result["ok"]:
        print(f"OK: {result['ops']} operations replayed, every result as recorded")
    else:
        print(
            f"diverged at operation {result['op_number']} ({result['op']}): "
            f"expected {result['expected']}, got {result['actual']}"
        )
    return 0 if result["ok"] else 1


def _add_trace(sub: argparse._SubParsersAction) -> None:
    from swajax.serving.workloads import WORKLOADS

    p = sub.add_parser("record", help="record allocator / prefix-cache operations of a run")
    p.add_argument("--preset", metavar="NAME", default="tiny-hybrid")
    p.add_argument("--hf-config", metavar="PATH")
    p.add_argument("--kv-budget-gib", type=float, default=0.002)
    p.add_argument("--ratio", type=float, default=0.3)
    p.add_argument("--page-size", type=int, default=4)
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--workload", choices=WORKLOADS, default="multi-turn")
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, metavar="TRACE.jsonl")
    p.set_defaults(func=_cmd_record)
    p = sub.add_parser("replay", help="replay a trace against swajax; report the first divergence")
    p.add_argument("trace", metavar="TRACE.jsonl")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_replay)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swajax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_plan(sub)
    _add_simulate(sub)
    _add_convert(sub)
    _add_generate(sub)
    _add_trace(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, ConfigError, sizing.SizingError, ValueError, RuntimeError, OSError) as e:
        print(f"swajax {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
