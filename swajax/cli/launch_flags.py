"""SGLang's and vLLM's launch lines as written: every flag of SGLang's `launch_server` and of
`vllm serve` (launch_flags.json, read from the two projects' own parsers by
tools/make_launch_flags.py) is known to `swajax serve` and `swajax generate`.

Each flag is honoured (the same setting under swajax's name: an alias in the command's own
parser, or a value mapped in `apply`), or accepted with one line saying it has no effect here and
why, or refused with the reason where running without it would give the user something else
than what the flag asks for (a LoRA adapter, a tool-call parser, TLS, several pipeline stages).
Spellings as the two projects take them: dashes or underscores, `--flag=value`, vLLM's
`--no-` forms, and vLLM's `--config FILE.yaml`.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from pathlib import Path

from swajax.cli.args import UsageError

TABLE = Path(__file__).with_name("launch_flags.json")
PREFIX = "launch__"  # the dest of a foreign flag this parser knows only from the table
GLOBAL = {"-h", "--help", "-v", "--verbose", "-q", "--quiet", "--debug", "--version"}

# Flags honoured under another swajax name (given as aliases in the commands' own parsers,
# which therefore never reach the table's handling): listed here for docs/launch-flags.md.
ALIASES = {
    "--model-path": "--model",
    "--tp": "--tp-size",
    "-tp": "--tp-size",
    "--tensor-parallel-size": "--tp-size",
    "--max-num-seqs": "--max-running-requests",
    "--max-num-batched-tokens": "--chunked-prefill-size",
    "--block-size": "--page-size",
    "--max-model-len": "--context-length",
    "--gpu-memory-utilization": "--mem-fraction-static",
    "--random-seed": "--seed",
}

# Refused when given (a value of 1, where a count, is the single process this is).
REFUSED = {
    "--enable-lora": "swajax serves no LoRA adapters",
    "--lora-modules": "swajax serves no LoRA adapters",
    "--lora-paths": "swajax serves no LoRA adapters",
    "--enable-auto-tool-choice": "swajax returns the model's text; it parses no tool calls",
    "--tool-call-parser": "swajax returns the model's text; it parses no tool calls",
    "--reasoning-parser": "swajax returns the model's text; it separates no reasoning",
    "--tokenizer": "swajax reads the tokenizer in the model's own folder",
    "--tokenizer-path": "swajax reads the tokenizer in the model's own folder",
    "--disable-sliding-window": "the sliding windows are the model's attention; swajax keeps them",
    "--hf-overrides": "swajax reads the checkpoint's config as published",
    "--json-model-override-args": "swajax reads the checkpoint's config as published",
    "--ssl-keyfile": "swajax serves plain HTTP: put a TLS proxy in front of it",
    "--ssl-certfile": "swajax serves plain HTTP: put a TLS proxy in front of it",
    "--is-embedding": "swajax generates text; it serves no embeddings",
    "--load-format": "swajax reads safetensors checkpoints (or orbax)",
    "--chat-template": "swajax renders the chat template in the model's folder "
    "(chat_template.jinja or tokenizer_config.json's): put it there",
}
COUNTS = {  # a count above 1 refused: (why)
    "--pipeline-parallel-size": "swajax runs no pipeline stages",
    "-pp": "swajax runs no pipeline stages",
    "--pp-size": "swajax runs no pipeline stages",
    "--data-parallel-size": "one `swajax serve` is one replica: run several behind a balancer",
    "-dp": "one `swajax serve` is one replica: run several behind a balancer",
    "--dp-size": "one `swajax serve` is one replica: run several behind a balancer",
    "--dp": "one `swajax serve` is one replica: run several behind a balancer",
    "--nnodes": "`swajax serve` is one process (`swajax generate` joins several: --coordinator)",
}
LOAD_FORMATS = ("auto", "safetensors")

# No effect, and why: by the flag, then by words in its name, then by its group.
NO_EFFECT = {
    "--trust-remote-code": "swajax runs its own model code, never a checkpoint's",
    "--enable-metrics": "/metrics is always on",
    "--enable-chunked-prefill": "chunked prefill is always on (--chunked-prefill-size)",
    "--quantization": "swajax reads the quantization the checkpoint's config names "
    "(--dequantize-weights holds it dequantized)",
    "--device": "JAX chooses the platform (JAX_PLATFORMS)",
    "--max-prefill-tokens": "--chunked-prefill-size bounds a step's prompt tokens here",
    "--max-total-tokens": "the pools are sized by --kv-budget-gib or --mem-fraction-static",
    "--swap-space": "the pools are sized by --kv-budget-gib; --host-cache-gib keeps a host tier",
    "--disable-log-requests": "swajax does not log requests",
    "--enable-log-requests": "swajax does not log requests",
    "--log-requests": "swajax does not log requests",
    "--skip-tokenizer-init": "the tokenizer is read only where the folder has one",
}
BY_WORD = (
    (
        r"tokenizer",
        "swajax tokenizes with the `tokenizers` library from the model folder's tokenizer.json",
    ),
    (
        r"cuda-graph|torch-compile|compilation|enforce-eager|^-O$|piecewise",
        "swajax compiles each step with XLA (Pallas kernels on GPU and TPU): there is no CUDA "
        "graph or torch.compile to configure",
    ),
    (
        r"backend|kernel|triton|flashinfer|cutlass|deep-?gemm|nccl|nvshmem|deepep|mooncake|aiter",
        "swajax's attention and matrix products are its own (XLA, Pallas: --attention); "
        "there is no kernel backend to choose",
    ),
    (
        r"disaggregation|kv-transfer|kv-events|pd-|prefill-only|decode-only|lmcache|hicache|"
        r"offload|flexkv|mooncake|kv-connector",
        "swajax's KV lives in its two pools and, with --host-cache-gib, a host tier; there is no "
        "external KV store or prefill/decode split",
    ),
    (
        r"expert|moe|^--ep|eplb|-ep-",
        "swajax runs every expert in one process, split by --tp-size",
    ),
    (
        r"(^-+|-)(log|logs|logging|trace|tracing|otlp|metrics?|profiler?|profiling|debug|crash|"
        r"dump|watchdog|stats)(-|$)",
        "swajax logs with -v / -q and always serves /metrics; it has no further tracing",
    ),
    (
        r"mm-|multimodal|image|video|audio|vision|processor|media",
        "swajax serves text: no multimodal inputs",
    ),
    (
        r"lora",
        "swajax serves no LoRA adapters (this one only tunes them)",
    ),
)
BY_GROUP = {
    "ParallelConfig": "swajax splits one model over --tp-size devices in one process",
    "CacheConfig": "swajax sizes its pools by --kv-budget-gib / --mem-fraction-static and its "
    "prefix cache by --cache-policy",
    "SchedulerConfig": "swajax's scheduler has its own policy (SGLang's: --cache-policy)",
    "Frontend": "a setting of vLLM's HTTP front end that swajax's server does not have",
    "ObservabilityConfig": "swajax always serves /metrics; it has no further tracing",
    "LoadConfig": "swajax reads safetensors checkpoints from a folder or the hub cache",
    "ModelConfig": "a model setting vLLM reads that swajax takes from the checkpoint",
}


@functools.cache
def table() -> dict:
    """{peer: {"version": str, "flags": [[spellings], arity, group]}}."""
    return json.loads(TABLE.read_text())


@functools.cache
def flags() -> dict[str, tuple[str, str, str, str]]:
    """Every spelling: (its canonical spelling, arity, group, peer)."""
    out = {}
    for peer, entry in table().items():
        for spellings, arity, group in entry["flags"]:
            for s in _with_old(spellings, arity):
                out.setdefault(s, (spellings[0], arity, group, peer))
    return out


def _with_old(spellings: list[str], arity: str) -> list[str]:
    """A switch's spellings, with vLLM's older off form (`--no-enable-x` beside today's
    `--disable-x`: launch lines written for earlier versions use it)."""
    first = spellings[0]
    if arity == "0" and first.startswith("--enable-") and "--no-" + first[2:] not in spellings:
        return [*spellings, "--no-" + first[2:]]
    return list(spellings)


def normalize(argv: list[str]) -> list[str]:
    """Underscores in a long flag's name as dashes (both projects take them), and vLLM's
    `--config FILE.yaml` expanded in place, before the line's own flags (which override it)."""
    out = []
    for arg in argv:
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            arg = name.replace("_", "-") + eq + value
        out.append(arg)
    config = [i for i, a in enumerate(out) if a == "--config" or a.startswith("--config=")]
    if not config:
        return out
    i = config[0]
    if out[i] == "--config":
        if i + 1 >= len(out):
            raise UsageError("--config needs a YAML file")
        path, rest = out[i + 1], out[:i] + out[i + 2 :]
    else:
        path, rest = out[i].partition("=")[2], out[:i] + out[i + 1 :]
    command = next(j for j, a in enumerate(rest) if a in ("generate", "serve"))
    return [*rest[: command + 1], *config_args(Path(path)), *rest[command + 1 :]]


def config_args(path: Path) -> list[str]:
    """The flags a vLLM config file sets: `key: value` as `--key value` (a list as several
    values, true as the bare flag, false as vLLM's `--no-key`)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise UsageError(f"--config {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise UsageError(f"--config {path}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of flag names to values")
    out = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + flag[2:])
        elif isinstance(value, list):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def add_to(p: argparse.ArgumentParser) -> None:
    """Every flag of the table the parser does not know yet, hidden from --help (the table is
    docs/launch-flags.md)."""
    own = {s for a in p._actions for s in a.option_strings}
    taken = own | GLOBAL  # (vLLM's `-q` for --quantization stays swajax's --quiet)
    for canonical, (spellings, arity, _) in _by_canonical().items():
        mine = own & set(spellings)
        if mine:  # swajax's own flag: the launcher's other spellings are its aliases
            action = p._option_string_actions[sorted(mine)[0]]
            for s in spellings:
                if s not in taken:
                    action.option_strings.append(s)
                    p._option_string_actions[s] = action
                    taken.add(s)
            continue
        free = [s for s in spellings if s not in taken]  # (another peer's spelling may be first)
        taken.update(free)
        dest = PREFIX + canonical.lstrip("-").replace("-", "_")
        hidden = dict(dest=dest, help=argparse.SUPPRESS)
        if arity == "0":
            on = [s for s in free if not _negative(s)]
            off = [s for s in free if _negative(s)]
            if on:
                p.add_argument(*on, action="store_const", const=True, **hidden)
            if off:
                p.add_argument(*off, action="store_const", const=False, **hidden)
        elif free:
            extra = dict(const=True) if arity == "?" else {}
            p.add_argument(*free, nargs=None if arity == "1" else arity, **hidden, **extra)


@functools.cache
def _by_canonical() -> dict[str, tuple[list[str], str, str]]:
    out: dict[str, tuple[list[str], str, str]] = {}
    for entry in table().values():
        for spellings, arity, group in entry["flags"]:
            spellings = _with_old(spellings, arity)
            if spellings[0] not in out:
                out[spellings[0]] = (spellings, arity, group)
            else:  # both launchers have it: every spelling of either
                known = out[spellings[0]][0]
                known += [s for s in spellings if s not in known]
    return out


def _negative(spelling: str) -> bool:
    return spelling.startswith("--no-") or (
        spelling.startswith("--disable-") and "--enable-" + spelling[10:] in flags()
    )


def apply(args: argparse.Namespace, say) -> None:
    """Honour, note or refuse each table flag the line gave (`say`: one line to the user)."""
    for dest, value in sorted(vars(args).items()):
        if not dest.startswith(PREFIX) or value is None:
            continue
        canonical = _canonical_of(dest)
        spellings, arity, group = _by_canonical()[canonical]
        shown = f"{canonical} {_text(value)}".rstrip() if arity != "0" else canonical
        if value is False and arity == "0":
            shown = next((s for s in spellings if _negative(s)), canonical)
        if _honoured(canonical, value, args):
            continue
        allowed = value is False or (canonical == "--load-format" and value in LOAD_FORMATS)
        if canonical in REFUSED and not allowed:  # (a `--no-` / `--disable-` form asks nothing)
            raise UsageError(f"{shown}: {REFUSED[canonical]}")
        if canonical in COUNTS:
            if _count(value) > 1:
                raise UsageError(f"{shown}: {COUNTS[canonical]}")
            say(f"{shown} has no effect here: one is what swajax runs")
            continue
        say(f"{shown} has no effect here: {why_no_effect(canonical)}")


def why_no_effect(canonical: str) -> str:
    if canonical in NO_EFFECT:
        return NO_EFFECT[canonical]
    if canonical in REFUSED:  # its off form
        return "swajax has no such feature to turn off"
    for pattern, why in BY_WORD:
        if re.search(pattern, canonical):
            return why
    _, _, group, peer = flags()[canonical]
    name = {"sglang": "SGLang", "vllm": "vLLM"}[peer]
    return BY_GROUP.get(group, f"a setting of {name}'s runtime that swajax's engine does not have")


def _honoured(canonical: str, value, args) -> bool:
    """Map the flags whose meaning is one of swajax's settings; True when done."""
    if canonical == "--enable-prefix-caching":  # (vLLM: on unless --no-enable-prefix-caching)
        args.disable_radix_cache = getattr(args, "disable_radix_cache", False) or value is False
        return True
    if canonical == "--enable-chunked-prefill" and value is False:
        args.chunked_prefill_size = None  # whole prompts in one step
        return True
    if canonical in ("--log-level", "--uvicorn-log-level", "--log-level-http"):
        level = str(value).lower()
        if canonical == "--log-level":
            args.verbose = {"debug": 2, "trace": 2, "info": 1}.get(level, 0)
            args.quiet = level in ("error", "critical")
        if hasattr(args, "uvicorn_log_level"):
            args.uvicorn_log_level = level if level != "trace" else "debug"
        return True
    return False


def _canonical_of(dest: str) -> str:
    name = dest.removeprefix(PREFIX)
    for canonical in _by_canonical():
        if canonical.lstrip("-").replace("-", "_") == name:
            return canonical
    raise KeyError(dest)


def _count(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 2  # not a count we can run


def _text(value) -> str:
    if value is True:
        return ""
    if isinstance(value, list):
        return " ".join(map(str, value))
    return str(value)


def disposition(spelling: str) -> str:
    """What swajax does with a flag, in a few words (docs/launch-flags.md)."""
    canonical, arity, group, _ = flags()[spelling]
    if spelling in ALIASES:
        return f"honoured: {ALIASES[spelling]}"
    if canonical in HONOURED:
        return f"honoured: {HONOURED[canonical]}"
    if canonical in REFUSED:
        if arity == "0" and any(_negative(s) for s in flags() if flags()[s][0] == canonical):
            return f"refused: {REFUSED[canonical]} (its off form: no effect)"
        return f"refused: {REFUSED[canonical]}" + (
            " (auto and safetensors: no effect)" if canonical == "--load-format" else ""
        )
    if canonical in COUNTS:
        return f"1: no effect; more: refused ({COUNTS[canonical]})"
    return f"no effect: {why_no_effect(canonical)}"


HONOURED = {  # mapped in `_honoured` (the rest of the honoured ones are ALIASES)
    "--config": "a YAML file of flags (the line's own flags override it)",
    "--enable-prefix-caching": "on by default; the `--no-` form is --disable-radix-cache",
    "--enable-chunked-prefill": "always on; the `--no-` form takes whole prompts in a step",
    "--log-level": "swajax's log level (debug, info: -vv, -v; error: -q) and uvicorn's",
    "--uvicorn-log-level": "uvicorn's log level",
    "--log-level-http": "uvicorn's log level",
}


def markdown() -> str:
    """docs/launch-flags.md: every flag of both launchers and what it does here."""
    lines = [
        "# SGLang's and vLLM's launch flags",
        "",
        "`swajax serve` and `swajax generate` take a launch line of SGLang's `launch_server` or",
        "of `vllm serve` as written (dashes or underscores, `--flag=value`, vLLM's `--no-` forms",
        "and `--config FILE.yaml`, `vllm serve MODEL`'s positional model). Each flag below is",
        "honoured under swajax's name, accepted with one line saying it has no effect here and",
        "why, or refused with the reason. Generated from `swajax/cli/launch_flags.json`",
        "(`tools/make_launch_flags.py`, from the projects' own parsers) by",
        "`swajax.cli.launch_flags.markdown()`; a test keeps this page equal to it.",
        "",
        "swajax's own flags that take these names as they are (`--model`, `--dtype`,",
        "`--kv-cache-dtype` with `auto` and `fp8`, `--context-length`, `--page-size`,",
        "`--chunked-prefill-size`, `--max-running-requests`, `--mem-fraction-static`,",
        "`--swa-full-tokens-ratio`, `--disable-hybrid-swa-memory`, `--disable-radix-cache`,",
        "`--tp-size`, `--served-model-name`, `--api-key`, `--host`, `--port`, `--revision`,",
        "`--seed`, `--max-logprobs`, `--generation-config`, the speculative flags) are in",
        "[the command line](cli.md).",
    ]
    for peer, entry in sorted(table().items()):
        name = {"sglang": "SGLang", "vllm": "vLLM"}[peer]
        lines += ["", f"## {name} {entry['version']}", "", "| flag | here |", "| --- | --- |"]
        for spellings, _, _ in entry["flags"]:
            shown = ", ".join(f"`{s}`" for s in spellings)
            lines.append(f"| {shown} | {_own_or(spellings)} |")
    return "\n".join(lines) + "\n"


def _own_or(spellings: list[str]) -> str:
    from swajax.cli.main import build_parser

    own = _own_spellings(build_parser) - GLOBAL
    if any(s in own for s in spellings) and not any(s in ALIASES for s in spellings):
        return "swajax's own flag"
    if GLOBAL & set(spellings):
        taken = ", ".join(sorted(GLOBAL & set(spellings)))
        return f"{disposition(spellings[0])} ({taken}: swajax's own, as before the command)"
    return disposition(spellings[0])


@functools.cache
def _own_spellings(build_parser) -> frozenset[str]:
    serve = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["serve"]
    return frozenset(
        s for a in serve._actions if not a.dest.startswith(PREFIX) for s in a.option_strings
    )
