"""Validation at the command line's edge: argument types that name the value and the limit.

Each type raises `argparse.ArgumentTypeError`, which the parser prints as one line
(`swajax CMD: error: argument --x: ...`) with exit status 2, before any work starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from swajax import presets
from swajax.config import HybridConfig, load_hf_config
from swajax.errors import InputError


class UsageError(InputError):
    """Bad command-line input found after parsing: printed as one line, exit status 2."""


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def int_at_least(lo: int, hi: int | None = None):
    """An integer in [lo, hi]."""

    def parse(text: str) -> int:
        value = _int(text)
        if value < lo or (hi is not None and value > hi):
            limit = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"must be an integer {limit}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def float_in(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False):
    """A finite float in [lo, hi] (open at either end if asked)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        inside = (value > lo if lo_open else value >= lo) and (
            value < hi if hi_open else value <= hi
        )
        if not math.isfinite(value) or not inside:
            limits = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
            raise argparse.ArgumentTypeError(f"must be a number in {limits}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


POSITIVE = int_at_least(1)
PAGE_SIZE = int_at_least(1, 1 << 16)
SEED = int_at_least(0, 2**32 - 1)
RATIO = float_in(0.0, 1.0, lo_open=True)
BUDGET_GIB = float_in(0.0, 1 << 20, lo_open=True)
HOST_GIB = float_in(0.0, 1 << 20)
TEMPERATURE = float_in(0.0, 1e4)
TOP_P = float_in(0.0, 1.0, lo_open=True)
MAX_REQUESTS = int_at_least(1, 1_000_000)
PROBABILITY = float_in(0.0, 1.0)


def out_file(suffix: str, *others: str):
    """A path to write, ending in `suffix` (or one of `others`), whose folder exists and which
    is not a folder."""

    def parse(text: str) -> Path:
        path = Path(text)
        if not any(text.endswith(s) for s in (suffix, *others)):
            ends = " or ".join((suffix, *others))
            raise argparse.ArgumentTypeError(f"must end in {ends}, got {text!r}")
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a {suffix} file")
        if not path.parent.is_dir():
            raise argparse.ArgumentTypeError(f"folder {str(path.parent)!r} does not exist")
        return path

    parse.__name__ = f"{suffix} file"
    return parse


def token_ids(text: str) -> list[int]:
    """Comma-separated non-negative token ids, at least one."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise argparse.ArgumentTypeError(f"must be comma-separated token ids, got {text!r}")
    ids = [_int(p) for p in parts]
    if min(ids) < 0:
        raise argparse.ArgumentTypeError(f"token ids must be >= 0, got {min(ids)}")
    return ids


def model_config(args: argparse.Namespace, default_preset: str | None = None) -> HybridConfig:
    """The model of `--preset NAME` or `--hf-config PATH` (exactly one, or the default)."""
    if args.preset is not None and args.hf_config is not None:
        raise UsageError("give one of --preset NAME or --hf-config PATH, not both")
    if args.preset is None and args.hf_config is None:
        if default_preset is None:
            raise UsageError("give one of --preset NAME or --hf-config PATH")
        args.preset = default_preset
    if args.preset is not None:
        try:
            return presets.load_preset(args.preset)
        except KeyError as e:
            raise UsageError(e.args[0]) from e
    return load_hf_config(args.hf_config)


def add_model_choice(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", metavar="NAME", help=f"one of: {', '.join(presets.preset_names())}")
    p.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json (or its folder)")


def raw_config(args: argparse.Namespace) -> dict:
    """The config.json-shaped dict of `--preset` or `--hf-config` (after `model_config`)."""
    if args.preset is not None:
        return dict(presets.hf_preset(args.preset))
    path = Path(args.hf_config)
    return json.loads((path / "config.json" if path.is_dir() else path).read_text())


def model_cost(cfg: dict, *, dequantize_weights: bool = False):
    """The step-time model's `ModelCost` of a config: the parameters and bytes its decoder holds
    as loaded (bfloat16, the checkpoint's quantized weights kept unless `dequantize_weights`),
    counted from the decoder's abstract form (`swajax.models.footprint`)."""
    from swajax.config import ConfigError
    from swajax.models.footprint import config_footprint
    from swajax.simulator.step_time import ModelCost

    try:
        f = config_footprint(cfg, dequantize_weights=dequantize_weights)
    except ConfigError as e:
        raise UsageError(f"weight bytes need a model swajax builds: {e}") from None
    return ModelCost(
        f.params, f.active_params, f.weight_bytes, f.experts, f.top_k, routed_bytes=f.expert_bytes
    )


def step_timer(args: argparse.Namespace, cfg: HybridConfig, budget_bytes: int):
    """The step-time model of `--accelerator NAME [--devices N]` for the model of `--preset` or
    `--hf-config` (its weights counted as loaded); devices default to what the weights plus the
    KV budget need."""
    from swajax.simulator.step_time import ACCELERATORS, StepTimeModel

    dequantize = getattr(args, "dequantize_weights", False)
    cost = model_cost(raw_config(args), dequantize_weights=dequantize)
    kv = getattr(args, "dtype", "bf16")  # plan and simulate: the KV element type
    timer = StepTimeModel(cfg, cost, ACCELERATORS[args.accelerator], kv_dtype=kv)
    devices = args.devices or timer.devices_needed(budget_bytes)
    return dataclasses.replace(timer, devices=devices)


def add_timer_choice(p: argparse.ArgumentParser, required: bool) -> None:
    from swajax.simulator.step_time import ACCELERATORS

    p.add_argument(
        "--accelerator",
        choices=sorted(ACCELERATORS),
        required=required,
        help="model step time on this chip (roofline: bandwidth, FLOPs)",
    )
    p.add_argument(
        "--devices",
        type=POSITIVE,
        default=None,
        help="chips one model instance spans (default: weights + KV fit)",
    )


def workload_choice(value: str) -> str:
    """A built-in workload name or an existing JSON-lines file."""
    from swajax.simulator.workloads import WORKLOADS

    if value in WORKLOADS or Path(value).is_file():
        return value
    if Path(value).exists():
        raise argparse.ArgumentTypeError(f"{value} is not a regular file")
    raise argparse.ArgumentTypeError(
        f"must be one of {', '.join(WORKLOADS)} or a JSON-lines file, got {value!r}"
    )


def add_cache_policy(p: argparse.ArgumentParser) -> None:
    from swajax.prefix_cache.policy import DEFAULT, PROFILES

    p.add_argument(
        "--cache-policy",
        choices=sorted(PROFILES),
        default=DEFAULT,
        help="prefix-cache rules (swajax's or SGLang 0.5.23's)",
    )
    p.add_argument(
        "--no-tail-rebuild",
        dest="tail_rebuild",
        action="store_false",
        help="resume a prefix hit whose SWA tail was evicted at the fallback point "
        "(recompute everything after it) instead of rebuilding the tail",
    )


def add_draft_choice(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--draft-preset", metavar="NAME", help="a speculative draft model whose KV shares the pools"
    )
    p.add_argument("--draft-hf-config", metavar="PATH", help="the draft's config.json")


def add_emulated_speculation(p: argparse.ArgumentParser) -> None:
    """The null model's emulated draft: how many tokens a round verifies, how often each is
    accepted."""
    g = p.add_argument_group("speculative decoding (an emulated draft)")
    add_draft_choice(g)
    g.add_argument(
        "--num-speculative-tokens",
        type=int_at_least(0, 64),
        default=0,
        help="draft tokens verified per decode step",
    )
    g.add_argument(
        "--acceptance",
        type=PROBABILITY,
        default=0.7,
        help="chance that each draft token is accepted",
    )


def draft_config(args: argparse.Namespace):
    """A speculative draft model's config (`--draft-preset NAME` or `--draft-hf-config PATH`),
    or None."""
    from swajax import presets
    from swajax.config import load_hf_config

    if args.draft_preset is not None and args.draft_hf_config is not None:
        raise UsageError("give one of --draft-preset or --draft-hf-config, not both")
    if args.draft_preset is not None:
        try:
            return presets.load_preset(args.draft_preset)
        except KeyError as e:
            raise UsageError(e.args[0]) from e
    return load_hf_config(args.draft_hf_config) if args.draft_hf_config else None


def load_object(spec: str, flag: str):
    """`module:name` (--backend: a factory called with the trace header, returning (allocator,
    prefix cache) with swajax's method names; --adapter: a class, see swajax.conformance)."""
    import importlib

    module, _, name = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise UsageError(f"{flag} {spec!r}: cannot load it ({e})") from e
    if not callable(obj):
        raise UsageError(f"{flag} {spec!r} is not callable")
    return obj


# Help for flags several commands share (each means the same everywhere); `fill_help` gives it
# to any of them registered without one, so no option is left undocumented (a test checks).
SHARED_HELP = {
    "--dtype": "bytes per KV element for sizing: bf16, fp16, fp32 or fp8",
    "--eviction-interval": "decode steps between runtime SWA evictions",
    "--requests": "how many requests the workload holds",
    "--clients": "send the workload from N clients, each sending its next request when its "
    "last one finishes (a closed loop at N outstanding requests; default: all as the workload "
    "says)",
    "--seed": "random seed (workloads; sampling with --temperature)",
    "--kv-budget-gib": "GiB of KV for both pools together",
    "--host-cache-gib": "GiB of host memory for a host tier of the prefix cache: KV evicted "
    "from the device moves there and hits load it back (hybrid pools; 0: none)",
    "--swa-full-tokens-ratio": "swa_full_tokens_ratio: SWA pool tokens per full pool token",
    "--page-size": "tokens per KV page",
    "--json": "print JSON instead of a table",
    "--attention": "attention implementation: the XLA path or the Pallas kernels",
    "--disable-hybrid-swa-memory": "one pool for every layer (no SWA pool)",
    "--disable-radix-cache": "share nothing between requests (no radix tree)",
    "--max-tokens": "most tokens to generate per prompt",
    "--temperature": "sampling temperature (0: greedy)",
    "--top-p": "nucleus sampling: keep the smallest set of tokens with this much mass",
    "--chunk-size": "prefill chunk size in tokens",
    "--workload": "a built-in workload name or a JSON-lines file",
    "--out": "file to write",
    "trace": "a trace file written by `swajax record` (JSON lines, optionally .gz)",
    "folder": "the conformance kit's folder",
}


def fill_help(parser: argparse.ArgumentParser) -> None:
    """Give every option of `parser` and its subcommands a help string and its default."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                fill_help(sub)
        elif action.help is None and not isinstance(action, argparse._HelpAction):
            name = action.option_strings[0] if action.option_strings else action.dest
            action.help = SHARED_HELP.get(name)
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
