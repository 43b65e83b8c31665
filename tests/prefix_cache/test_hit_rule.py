"""The window hit rule (`prefix_cache/hit_rule.py`, the one function the tree and the host tier
call) against its definition written out by brute force: the deepest end at which the last
nodes before it hold at least W contiguous tokens with their SWA KV, or no gap at all lies above
it; with `usable`, no end past the first node that is not."""

from __future__ import annotations

from hypothesis import given, strategies as st

from swajax.prefix_cache.hit_rule import hit_end


class N:
    def __init__(self, length: int, swa: bool, usable: bool):
        self.length, self.swa, self.usable = length, swa, usable

    def __len__(self) -> int:
        return self.length


def brute(path, window, with_usable):
    limit = len(path)
    if with_usable:
        limit = next((i for i, n in enumerate(path) if not n.usable), len(path))

    def valid(k):
        kept = path[:k]
        if all(n.swa for n in kept):
            return True
        run = 0
        for n in reversed(kept):
            if not n.swa:
                break
            run += len(n)
        return run >= window

    return max(k for k in range(limit + 1) if valid(k))


nodes = st.builds(N, st.integers(1, 9), st.booleans(), st.integers(0, 9).map(lambda x: x > 0))


@given(st.lists(nodes, max_size=10), st.integers(0, 20), st.booleans())
def test_hit_end_is_its_definition(path, window, with_usable):
    usable = (lambda n: n.usable) if with_usable else None
    assert hit_end(path, window, lambda n: n.swa, usable) == brute(path, window, with_usable)


def test_an_end_one_token_short_of_the_window_is_refused():
    live, gap = N(7, True, True), N(3, False, True)
    assert hit_end([gap, live, gap], 7, lambda n: n.swa) == 2  # 7 live tokens before the end
    assert hit_end([gap, live, gap], 8, lambda n: n.swa) == 0  # W + 1: not enough
    assert hit_end([live, live], 100, lambda n: n.swa) == 2  # no gap from the root
