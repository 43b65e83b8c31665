"""Why each match of a recorded trace gave what it gave: the trace replayed through swajax's
own cache (the profile it names), each match's report kept (prefix_cache/explain.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from swajax.trace.replay import replay, swajax_backend


def explain_trace(path: str | Path) -> dict:
    """{"ok", "ops", "matches": [{"op": n, **report}], "missed": {reason: tokens}} ("ok" is
    False, with the divergence, when swajax's cache does not reproduce the trace: the matches
    up to it are explained)."""
    matches: list[dict] = []
    ops = [0]

    def backend(init):
        alloc, cache = swajax_backend(init)
        inner = cache.match

        def match(tokens):
            result = inner(tokens)
            matches.append(dict(op=ops[0] + 1, **result.report.as_dict()))
            return result

        cache.match = match
        return alloc, cache

    outcome = replay(path, backend=backend, answers=_Counting(ops))
    missed = Counter()
    for m in matches:
        missed[m["stop"]] += m["missed"]
    return dict(outcome, matches=matches, missed=dict(missed))


class _Counting(list):
    """The replay's answers list, counting operations as they are answered."""

    def __init__(self, ops: list[int]):
        super().__init__()
        self._ops = ops

    def append(self, item):
        self._ops[0] += 1
        super().append(item)
