"""A step's model inputs padded to bucket shapes (host code): the forward batch, the penalty
seeds, and where an array sits in the packed upload."""

from __future__ import annotations

import numpy as np

from swajax.arith import bucket
from swajax.serving.batch import (
    SAMPLE_FIELDS,
    SAMPLE_PADDING,
    ForwardBatch,
    PenaltySeeds,
    StepPlan,
)

MIN_TOKENS = 64
DROP = 2**30  # a row index past every table: the device drops the write
SEEDS = ("seed_reset_rows", "seed_rows", "seed_tokens", "seed_is_output")
RULE_ENTRIES = ("rule_ids", "rule_values", "rule_until", "rule_allow")  # [S, B] each


def seed_arrays(plan: StepPlan) -> dict[str, np.ndarray]:
    """A step's penalty seeds, padded (out-of-range rows: the device drops them)."""
    seeds = plan.sampling.penalty_seeds
    if seeds is None:
        return {}
    r, n = bucket(len(seeds.reset_rows), 8), bucket(len(seeds.rows), MIN_TOKENS)
    return dict(zip(SEEDS, _seed_values(seeds, r, n)))


def seed_chunks(plan: StepPlan, rows: int, chunk: int):
    """A step's penalty seeds as fixed-size argument lists of `seed_penalties`, to load ahead
    of the step (a server's fixed shapes): the rows reset by the first, `chunk` counts each."""
    seeds = plan.sampling.penalty_seeds
    if seeds is None:
        return
    for lo in range(0, max(len(seeds.rows), 1), chunk):
        part = PenaltySeeds(
            seeds.reset_rows if lo == 0 else seeds.reset_rows[:0],
            *(x[lo : lo + chunk] for x in (seeds.rows, seeds.tokens, seeds.is_output)),
        )
        yield _seed_values(part, rows, chunk)


def _seed_values(seeds: PenaltySeeds, r: int, n: int) -> tuple[np.ndarray, ...]:
    return (
        _pad_to(seeds.reset_rows, r, np.int32, DROP),
        _pad_to(seeds.rows, n, np.int32, DROP),
        _pad_to(seeds.tokens, n, np.int32),
        _pad_to(seeds.is_output, n, np.int32),
    )


def _pad_to(x: np.ndarray, n: int, dtype, fill=0) -> np.ndarray:
    """`x` padded to n rows (its first axis) with `fill`."""
    x = np.asarray(x)
    out = np.full((n, *x.shape[1:]), fill, dtype)
    out[: len(x)] = x
    return out


def pad_forward(
    fwd: ForwardBatch,
    num_tokens: int,
    min_rows: int = 1,
    *,
    min_logits: int | None = None,
    rule_width: int = 0,
) -> ForwardBatch:
    """The forward inputs padded to bucket shapes (padding rows sample row 0, and are dropped):
    at least `min_rows` sampled rows, `min_logits` logit rows (default: min_rows) and
    `rule_width` token-rule entries per row (a server's fixed shapes)."""
    k = bucket(len(fwd.logit_index), min_logits or min_rows)
    s = bucket(len(fwd.temperature), min_rows)
    sampling = {
        name: _pad_to(value, s, value.dtype, SAMPLE_PADDING.get(name, 0))
        for name, value in zip(SAMPLE_FIELDS, fwd[3:])
    }
    if rule_width:
        for name in RULE_ENTRIES:
            value = sampling[name]
            b = bucket(value.shape[1], rule_width)
            out = np.full((s, b), SAMPLE_PADDING.get(name, 0), value.dtype)
            out[:, : value.shape[1]] = value
            sampling[name] = out
    return ForwardBatch(
        tokens=_pad_to(fwd.tokens, num_tokens, np.int32),
        logit_index=_pad_to(fwd.logit_index, k, np.int32),
        sample_index=_pad_to(fwd.sample_index, s, np.int32),
        **sampling,
    )


def offset(layout, name: str) -> tuple[int, int]:
    """(start, size) of one array in a packed buffer."""
    start = 0
    for key, shape, _ in layout:
        size = int(np.prod(shape))
        if key == name:
            return start, size
        start += size
    raise KeyError(name)
