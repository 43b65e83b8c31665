"""Batch-invariant numerics (`deterministic=True`): a token's results do not depend on its
companions.

A matrix product's row is not a function of that row alone on XLA: the library picks its
blocking, and with it the order of each dot product's additions, from the whole operand's shape
(measured on XLA:CPU: a row of x @ w differs in its last bits between 1, 2, 8 and 300 rows).
Run as fixed tiles of ROW_TILE rows, every product has one shape, and a row's bits are the same
in any tile, at any position (measured: companions and position changed, the bits did not). So
in this mode every weight product runs tile by tile (`rows`), the experts' grouped products use
blocks of ROW_TILE rows, and attention is `swajax.attention.invariant`.

The mode is a trace-time switch: the model's forward enters `batch_invariant(True)` while it is
traced, and the step programs are keyed by their `AttentionMode`, which carries the same flag,
so a program traced one way is never reused for the other.

Row-wise reductions (norms, routers) are as shape-dependent as products, so the norms and the
MLP / MoE blocks run tile by tile too (`per_token`); attention runs a query at a time.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

from swajax.attention.invariant import tiled
from swajax.switch import switched

ROW_TILE = 8

_ON = contextvars.ContextVar("batch_invariant", default=False)


def on() -> bool:
    """Whether the computation being traced is batch-invariant."""
    return _ON.get()


def batch_invariant(enabled: bool = True) -> contextlib.AbstractContextManager[None]:
    """Trace what runs inside batch-invariant (or not, with `enabled=False`)."""
    return switched(_ON, enabled)


def rows(fn, *xs):
    """fn(*xs) a tile of ROW_TILE rows at a time (each x [N, ...] split along its rows, padded
    with 0; the outputs put back together), in a loop XLA cannot count (`tiled`)."""
    return tiled(fn, xs, ROW_TILE)


def per_token(fn):
    """`fn` (of arrays whose rows are tokens) as batch-invariant mode runs it: tile by tile
    when on, as it is otherwise. For row-wise reductions (norms, routers' softmax): XLA picks
    their vectorization from the whole operand too (measured: a softmax row over 128 columns
    differs between 8 and 32 rows)."""
    return functools.partial(rows, fn) if on() else fn
