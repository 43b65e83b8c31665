"""Trace-time switches: a context variable set for the length of a block (the platform traced
for, batch invariance, the weights' split over devices), so that code deep in a traced model
asks it instead of every call passing it down."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def switched(var: contextvars.ContextVar[T], value: T) -> Iterator[None]:
    """`var` is `value` inside the block, and what it was before after it."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)
