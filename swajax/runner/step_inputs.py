"""A step's model inputs padded to bucket shapes (host code): the forward batch, the penalty
seeds, and where an array sits in the packed upload."""

from __future__ import annotations

import numpy as np

from swajax.arith import bucket
from swajax.serving.batch import SAMPLE_FIELDS, SAMPLE_PADDING, ForwardBatch, StepPlan

MIN_TOKENS = 64
SEEDS = ("seed_reset_rows", "seed_rows", "seed_tokens", "seed_is_output")


def seed_arrays(plan: StepPlan) -> dict[str, np.ndarray]:
    """A step's penalty seeds, padded (out-of-range rows: the device drops them)."""
    seeds = plan.sampling.penalty_seeds
    if seeds is None:
        return {}
    r, n, drop = bucket(len(seeds.reset_rows), 8), bucket(len(seeds.rows), MIN_TOKENS), 2**30
    values = (
        _pad_to(seeds.reset_rows, r, np.int32, drop),
        _pad_to(seeds.rows, n, np.int32, drop),
        _pad_to(seeds.tokens, n, np.int32),
        _pad_to(seeds.is_output, n, np.int32),
    )
    return dict(zip(SEEDS, values))


def _pad_to(x: np.ndarray, n: int, dtype, fill=0) -> np.ndarray:
    """`x` padded to n rows (its first axis) with `fill`."""
    x = np.asarray(x)
    out = np.full((n, *x.shape[1:]), fill, dtype)
    out[: len(x)] = x
    return out


def pad_forward(fwd: ForwardBatch, num_tokens: int, min_rows: int = 1) -> ForwardBatch:
    """The forward inputs padded to bucket shapes (padding rows sample row 0, and are dropped)."""
    k = bucket(len(fwd.logit_index), min_rows)
    s = bucket(len(fwd.temperature), min_rows)
    sampling = {
        name: _pad_to(value, s, value.dtype, SAMPLE_PADDING.get(name, 0))
        for name, value in zip(SAMPLE_FIELDS, fwd[3:])
    }
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
