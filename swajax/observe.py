"""Observed calls: a component (the pool ledger, a prefix cache, the scheduler) reports its
public operations to an `observer` it holds, so a recorder (`swajax.trace.recorder`) watches
it without replacing its methods. Only outermost calls are meant to be recorded (what a cache
does inside `insert` is replayed by `insert`); every call is reported, with `outermost` saying
which, because some bookkeeping (numbering lock handles) must see the nested ones too."""

from __future__ import annotations

import functools
from typing import Any, Protocol


class Observer(Protocol):
    depth: int  # observed calls in progress, over every component it watches

    def called(self, name: str, args: tuple, kwargs: dict, result: Any, *, outermost: bool):
        """`name(*args, **kwargs)` returned `result`."""


def observed(method):
    """Report calls of `method` to the instance's `observer` (if it has one)."""
    name = method.__name__

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        observer = self.observer
        if observer is None:
            return method(self, *args, **kwargs)
        observer.depth += 1
        try:
            result = method(self, *args, **kwargs)
        finally:
            observer.depth -= 1
        observer.called(name, args, kwargs, result, outermost=observer.depth == 0)
        return result

    return call
