"""SGLang's and vLLM's launch lines as written: every flag of SGLang's `launch_server` and of
`vllm serve` (swajax.foreign_flags) is known to `swajax serve` and `swajax generate`, honoured
(an alias in the command's own parser, or a value mapped in `apply`), said to have no effect
(one line, why) or refused (the reason). Spellings as the two projects take them: dashes or
underscores, `--flag=value`, vLLM's `--no-` / `--disable-` forms, and vLLM's
`--config FILE.yaml`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from swajax.cli.args import UsageError
from swajax.foreign_flags import (
    ALIASES,
    COUNTS,
    LOAD_FORMATS,
    REFUSED,
    by_canonical,
    disposition,
    negative,
    table,
    why_no_effect,
)

PREFIX = "launch__"  # the dest of a foreign flag this parser knows only from the table
GLOBAL = {"-h", "--help", "-v", "--verbose", "-q", "--quiet", "--debug", "--version"}


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
    for canonical, (spellings, arity, _) in by_canonical().items():
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
            on = [s for s in free if not negative(s)]
            off = [s for s in free if negative(s)]
            if on:
                p.add_argument(*on, action="store_const", const=True, **hidden)
            if off:
                p.add_argument(*off, action="store_const", const=False, **hidden)
        elif free:
            extra = dict(const=True) if arity == "?" else {}
            p.add_argument(*free, nargs=None if arity == "1" else arity, **hidden, **extra)


def apply(args: argparse.Namespace, say) -> None:
    """Honour, note or refuse each table flag the line gave (`say`: one line to the user)."""
    for dest, value in sorted(vars(args).items()):
        if not dest.startswith(PREFIX) or value is None:
            continue
        canonical = _canonical_of(dest)
        spellings, arity, group = by_canonical()[canonical]
        shown = f"{canonical} {_text(value)}".rstrip() if arity != "0" else canonical
        if value is False and arity == "0":
            shown = next((s for s in spellings if negative(s)), canonical)
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
    for canonical in by_canonical():
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


def markdown(parser: argparse.ArgumentParser) -> str:
    """docs/launch-flags.md: every flag of both launchers and what it does here (`parser`:
    swajax's, `swajax.cli.main.build_parser()`, whose own flags the page names as such)."""
    own = own_spellings(parser) - GLOBAL
    lines = [
        "# SGLang's and vLLM's launch flags",
        "",
        "`swajax serve` and `swajax generate` take a launch line of SGLang's `launch_server` or",
        "of `vllm serve` as written (dashes or underscores, `--flag=value`, vLLM's `--no-` forms",
        "and `--config FILE.yaml`, `vllm serve MODEL`'s positional model). Each flag below is",
        "honoured under swajax's name, accepted with one line saying it has no effect here and",
        "why, or refused with the reason. Generated from `swajax/foreign_flags.json`",
        "(`tools/make_launch_flags.py`, from the projects' own parsers) by",
        "`swajax.cli.launch_flags.markdown(build_parser())`; a test keeps this page equal to it.",
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
            lines.append(f"| {shown} | {_own_or(spellings, own)} |")
    return "\n".join(lines) + "\n"


def _own_or(spellings: list[str], own: frozenset[str]) -> str:
    if any(s in own for s in spellings) and not any(s in ALIASES for s in spellings):
        return "swajax's own flag"
    if GLOBAL & set(spellings):
        taken = ", ".join(sorted(GLOBAL & set(spellings)))
        return f"{disposition(spellings[0])} ({taken}: swajax's own, as before the command)"
    return disposition(spellings[0])


def own_spellings(parser: argparse.ArgumentParser) -> frozenset[str]:
    """The spellings `swajax serve` knows as its own flags (not the table's hidden ones)."""
    serve = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "serve"
    ]
    return frozenset(
        s for a in serve._actions if not a.dest.startswith(PREFIX) for s in a.option_strings
    )
