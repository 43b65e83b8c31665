"""Validation at the command line's edge: argument types that name the value and the limit.

Each type raises `argparse.ArgumentTypeError`, which the parser prints as one line
(`swajax CMD: error: argument --x: ...`) with exit status 2, before any work starts.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from swajax import presets
from swajax.config import HybridConfig, load_hf_config


class UsageError(Exception):
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
TEMPERATURE = float_in(0.0, 1e4)
TOP_P = float_in(0.0, 1.0, lo_open=True)
MAX_REQUESTS = int_at_least(1, 1_000_000)


def out_file(suffix: str):
    """A path to write, ending in `suffix`, whose folder exists and which is not a folder."""

    def parse(text: str) -> Path:
        path = Path(text)
        if path.suffix != suffix:
            raise argparse.ArgumentTypeError(f"must end in {suffix}, got {text!r}")
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
