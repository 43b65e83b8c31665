"""Why each match of a recorded trace gave what it gave: the trace replayed through swajax's
own cache (the profile it names), each match's report kept (prefix_cache/explain.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from swajax.trace.replay import read_lines, replay, swajax_backend


def explain_trace(path: str | Path) -> dict:
    """{"ok", "ops", "matches": [{"op": n, **report}], "missed": {reason: tokens}} ("ok" is
    False, with the divergence, when swajax's cache does not reproduce the trace: the matches
    up to it are explained)."""
    reports: list = []

    def backend(init):
        alloc, cache = swajax_backend(init)
        inner = cache.match

        def match(tokens):  # a trace's `match` lines are the only calls (no nested matches)
            result = inner(tokens)
            reports.append(result.report)
            return result

        cache.match = match
        return alloc, cache

    outcome = replay(path, backend=backend)
    numbers = [n for n, line in enumerate(read_lines(path)[1:], 1) if line["op"] == "match"]
    matches = [dict(op=n, **r.as_dict()) for n, r in zip(numbers, reports)]
    missed = Counter()
    for m in matches:
        missed[m["stop"]] += m["missed"]
    return dict(outcome, matches=matches, missed=dict(missed))
