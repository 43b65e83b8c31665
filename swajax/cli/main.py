"""The `swajax` command line.

Every error is one line, `swajax CMD: error: ...`, naming the value and the limit, with exit
status 2 (1 when the command ran but a request failed or a replay diverged); `--debug` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Sequence

from swajax import cluster, compile_cache, sizing
from swajax.cli import (
    args as args_lib,
    compile_check,
    conformance,
    generate,
    launch_flags,
    launch_local,
    plan,
    serve,
    simulate,
)
from swajax.cli.args import UsageError
from swajax.cli.cluster_args import cluster_of, join_inputs
from swajax.version import __version__


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr (no usage block) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _run_convert(args: argparse.Namespace) -> int:
    from swajax.models import load_decoder, save_orbax

    decoder = load_decoder(
        args.source, dtype=args.dtype or "auto", dequantize_weights=args.dequantize_weights
    )
    dtype = decoder.spec.dtype
    if args.to == "hf":
        from swajax.models.export import save_hf

        save_hf(decoder, args.source, args.out, dtype=dtype, force=args.force)
    else:
        save_orbax(decoder, args.source, args.out, force=args.force)
    print(f"wrote {args.out} ({args.to}, {dtype})")
    return 0


def _run_record(args: argparse.Namespace) -> int:
    from swajax.serving.options import EngineOptions
    from swajax.simulator.run import run_workload
    from swajax.simulator.workloads import make_workload
    from swajax.trace.recorder import Tracer

    cfg = args_lib.model_config(args, default_preset="tiny-hybrid")
    if not cfg.sliding_window:
        raise UsageError(f"{cfg.model_type} has no sliding layers: nothing hybrid to record")
    sizes = sizing.size_hybrid(
        cfg,
        sizing.gib_to_bytes(args.kv_budget_gib),
        ratio=args.swa_full_tokens_ratio,
        page_size=args.page_size,
        dtype="bf16",
        draft=args_lib.draft_config(args),
    )
    tracers = []
    options = EngineOptions(
        max_running=64,
        max_context=33_792,
        chunk_size=args.chunk_size,
        cache_policy=args.cache_policy,
        tail_rebuild=args.tail_rebuild,
        num_speculative_tokens=args.num_speculative_tokens,
    )
    summary = run_workload(
        cfg,
        sizes,
        make_workload(args.workload, args.requests, args.seed),
        options=options,
        progress=False,
        on_engine=lambda e: tracers.append(Tracer(e)),
        acceptance=args.acceptance,
        overlap=args.overlap,
    )
    summary.check_ran()  # before writing: a trace of nothing would agree with anything
    tracers[0].write(args.out)
    ran = tracers[0].ran()
    print(
        f"wrote {tracers[0].ops} operations to {args.out} ({summary.requests} requests ran, "
        f"{summary.rejected} rejected; overlap {ran['overlap']}: "
        f"{ran['launched_ahead']} steps launched ahead; {ran['speculative_tokens']} draft "
        f"tokens per round: {ran['accepted_tokens']} accepted)"
    )
    return 0


def _run_replay(args: argparse.Namespace) -> int:
    from swajax.trace.replay import replay, swajax_backend

    backend = args_lib.load_object(args.backend, "--backend") if args.backend else swajax_backend
    result = replay(args.trace, backend=backend)
    if args.json:
        print(json.dumps(result))
    elif result["ok"]:
        print(f"OK: {result['ops']} operations replayed, every result as recorded")
    else:
        detail = result.get("reason") or f"expected {result['expected']}, got {result['actual']}"
        print(f"diverged at operation {result['op_number']} ({result['op']}): {detail}")
    return 0 if result["ok"] else 1


def _run_explain(args: argparse.Namespace) -> int:
    from swajax.trace.explanations import explain_trace

    result = explain_trace(args.trace)
    if args.json:
        print(json.dumps(result))
        return 0 if result["ok"] else 1
    for m in result["matches"]:
        print(f"operation {m['op']}: {m['reason']}")
    asked = sum(m["asked"] for m in result["matches"])
    matched = sum(m["matched"] for m in result["matches"])
    print(f"{len(result['matches'])} matches: {matched} of {asked} tokens matched")
    for reason, tokens in sorted(result["missed"].items(), key=lambda kv: -kv[1]):
        if tokens:
            print(f"  missed {tokens} tokens: {reason}")
    if not result["ok"]:
        print(
            f"stopped at operation {result['op_number']} ({result['op']}): swajax's cache "
            "does not reproduce the trace from there"
        )
    return 0 if result["ok"] else 1


def _register_tools(sub) -> None:
    from swajax.simulator.workloads import WORKLOADS

    p = sub.add_parser("convert", help="a checkpoint's params as orbax, or back to Hugging Face")
    p.add_argument(
        "source", metavar="DIR", help="config.json + *.safetensors, or a folder this command wrote"
    )
    p.add_argument("out", metavar="OUT", help="output folder")
    p.add_argument(
        "--to",
        choices=("orbax", "hf"),
        default="orbax",
        help="orbax: config.json + params/; hf: config.json + .safetensors that "
        "transformers loads (quantized weights as they were read)",
    )
    p.add_argument(
        "--dequantize-weights",
        action="store_true",
        help="write quantized weights dequantized to --dtype",
    )
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="the params' dtype (default: the checkpoint's own)",
    )
    p.set_defaults(func=_run_convert)

    p = sub.add_parser("record", help="record allocator / prefix-cache operations of a run")
    args_lib.add_model_choice(p)
    p.add_argument("--kv-budget-gib", type=args_lib.BUDGET_GIB, default=0.002)
    p.add_argument("--swa-full-tokens-ratio", type=args_lib.RATIO, default=0.3)
    p.add_argument("--page-size", type=args_lib.PAGE_SIZE, default=4)
    p.add_argument("--chunk-size", type=args_lib.POSITIVE, default=64)
    p.add_argument("--workload", choices=WORKLOADS, default="multi-turn")
    p.add_argument("--requests", type=args_lib.MAX_REQUESTS, default=12)
    p.add_argument("--seed", type=args_lib.SEED, default=0)
    args_lib.add_cache_policy(p)
    p.add_argument(
        "--overlap",
        action="store_true",
        help="overlap scheduling: decode step n + 1 launched before n's result is "
        "read (the trace says so in its header's `ran`)",
    )
    args_lib.add_emulated_speculation(p)
    p.add_argument(
        "--out",
        type=args_lib.out_file(".jsonl", ".jsonl.gz"),
        required=True,
        metavar="T.jsonl[.gz]",
    )
    p.set_defaults(func=_run_record)

    p = sub.add_parser("replay", help="replay a trace against swajax; report the first divergence")
    p.add_argument("trace", metavar="TRACE.jsonl")
    p.add_argument(
        "--backend",
        metavar="MODULE:FACTORY",
        help="another backend: FACTORY(header) -> (allocator, cache)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run_replay)

    p = sub.add_parser("explain", help="why each prefix-cache match of a trace gave what it gave")
    p.add_argument("trace", metavar="TRACE.jsonl")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run_explain)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="swajax", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    parser.add_argument("--version", action="version", version=f"swajax {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log what happens (-v: info, -vv: debug)"
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="errors only: no progress bars, no info"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    plan.register(sub)
    simulate.register(sub)
    generate.register(sub)
    serve.register(sub)
    _register_tools(sub)
    conformance.register(sub)
    launch_local.register(sub)
    compile_check.register(sub)
    for name in ("generate", "serve"):  # SGLang's and vLLM's launch lines as written
        launch_flags.add_to(sub.choices[name])
    for command in sub.choices.values():  # the global flags after the command too
        _global_flags(command)
    args_lib.fill_help(parser)
    return parser


def _global_flags(p: argparse.ArgumentParser) -> None:
    """-v / -q / --debug on a command's own parser, set only when given there (so `swajax -v
    generate` and `swajax generate -v` mean the same)."""
    taken = {s for action in p._actions for s in action.option_strings}
    quiet = argparse.SUPPRESS
    if not {"-v", "--verbose"} & taken:
        p.add_argument(
            "-v", "--verbose", action="count", default=quiet, help="as before the command"
        )
    if not {"-q", "--quiet"} & taken:
        p.add_argument(
            "-q", "--quiet", action="store_true", default=quiet, help="as before the command"
        )
    if "--debug" not in taken:
        p.add_argument("--debug", action="store_true", default=quiet, help="as before the command")


class _Stderr(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time (tests swap it between commands)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def _configure_logging(verbose: int, quiet: bool) -> None:
    """The `swajax` loggers' level from -v / --quiet (warnings by default), one handler."""
    log = logging.getLogger("swajax")
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("swajax: %(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    levels = {0: logging.WARNING, 1: logging.INFO}
    log.setLevel(logging.ERROR if quiet else levels.get(verbose, logging.DEBUG))


def _warning(command: str, message: str) -> None:
    print(f"swajax {command}: warning: {message}", file=sys.stderr)


def _native_output_to_stderr() -> None:
    """Keep stdout for results: Python's prints stay on the real stdout, while whatever native
    code writes to file descriptor 1 (gloo notes each connection it makes there) goes to
    stderr."""
    sys.stdout.flush()
    results = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(results, "w", buffering=1)


def _command(argv: list[str], parser) -> str | None:
    """The command a line runs (its first word that names one)."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next((a for a in argv if a in commands.choices), None)


def _take_model_tag(args, argv: list[str]) -> None:
    """`swajax serve MODEL`, as `vllm serve MODEL`: the same as --model (both: the same one)."""
    given = {"--model", "--model-path"} & {a.partition("=")[0] for a in argv}
    if given and args.model != args.model_tag:
        raise UsageError(f"the model is given twice: {args.model_tag!r} and --model {args.model!r}")
    args.model = args.model_tag


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if not argv:  # bare `swajax`: the usage and the commands, not an error line
        parser.print_help()
        return 2
    try:
        if _command(argv, parser) in ("generate", "serve"):
            argv = launch_flags.normalize(argv)
        args = parser.parse_args(argv)
    except SystemExit as e:  # a bad argument (one line already printed), or --help
        return e.code if isinstance(e.code, int) else 2
    except UsageError as e:  # an unreadable --config
        print(f"swajax: error: {e}", file=sys.stderr)
        return 2
    try:
        if args.command in ("generate", "serve"):
            launch_flags.apply(
                args, lambda m: print(f"swajax {args.command}: {m}", file=sys.stderr)
            )
            if getattr(args, "model_tag", None) is not None:
                _take_model_tag(args, argv)
    except UsageError as e:
        print(f"swajax {args.command}: error: {e}", file=sys.stderr)
        return 2
    _configure_logging(args.verbose, args.quiet)
    try:
        joined = None
        if hasattr(args, "coordinator"):  # before anything touches JAX's devices
            joined = cluster_of(args)
            joined.check()  # before stdout is rearranged: a bad flag is a plain error line
            if joined.requested:
                _native_output_to_stderr()
                cluster.join(joined, join_inputs(argv))
            else:
                joined = None
        if not getattr(args, "no_compile_cache", True):
            # Programs of an earlier run on this machine are reused; a cache that cannot be
            # used is one warning line and the run goes on without it.
            compile_cache.enable(report=lambda m: _warning(args.command, m))
        if joined is None or cluster.is_leader():
            return args.func(args)
        with open(os.devnull, "w") as out, contextlib.redirect_stdout(out):
            return args.func(args)  # results are process 0's to print
    except Exception as e:  # noqa: BLE001 - the edge: every error becomes one line
        if args.debug:
            raise
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        known = (UsageError, ValueError, OSError, KeyError, RuntimeError)
        kind = "" if isinstance(e, known) else f"{type(e).__name__}: "
        print(f"swajax {args.command}: error: {kind}{message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
