"""A snapshot's prefix cache restored into pools of another size (`swajax.api.resize`): into
smaller pools the tree is evicted by its own recency lists, exactly the nodes that evicting the
same tree in place drops, and the restore says how many tokens went; the kept prefixes are hit
and read the saved KV (the same tokens as the same-size restore); into larger pools nothing is
dropped; nothing leaks either way; a running snapshot's requests are not carried over."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FIXTURES
from helpers.engine_checks import check_clean
from helpers.turns import SETUP

from swajax.api import make_engine
from swajax.api.state import restore_state, save_state
from swajax.errors import InputError
from swajax.models import load_decoder
from swajax.prefix_cache import check_invariants
from swajax.serving.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
SPEC = SETUP.replace(kv_budget_gib=0.002, max_running=4)


def _prompt(i: int) -> list[int]:
    return [(13 * i + 7 * j) % 119 + 1 for j in range(40 + 8 * (i % 3))]


def _paths(cache) -> set:
    def path(node):
        return tuple(t for n in reversed(list(node.path_to_root())) for t in n.key)

    return {(path(n), n.swa_live) for n in cache.nodes()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Eight conversations cached, a ninth request running: saved."""
    decoder = load_decoder(FIXTURES / "gpt_oss")
    engine = make_engine(decoder, SPEC)
    for i in range(8):
        engine.add_request(_prompt(i), GREEDY)
        engine.run()
    engine.add_request(_prompt(8), GREEDY)
    engine.step()
    folder = tmp_path_factory.mktemp("resize") / "snap"
    save_state(engine, folder)
    return decoder, folder


def _follow_up(engine) -> tuple[list[int], int, np.ndarray]:
    """A prompt extending the newest conversation: its tokens, cached tokens and logits."""
    rid = engine.add_request(_prompt(7) + [3, 1, 4, 1, 5], GREEDY, keep_logits=True)
    engine.run()
    req = engine.requests[rid]
    return req.output, req.cached_tokens, np.stack(req.logits)


def _same_follow_up(a, b) -> None:
    """The same tokens and hits; logits as close as two pool shapes' programs compute them
    (the kept pages are the saved bytes: a wrong page would change them wholesale)."""
    assert a[:2] == b[:2]
    np.testing.assert_allclose(a[2], b[2], rtol=1e-6, atol=1e-6)


def test_smaller_pools_keep_the_most_recent_prefixes(saved):
    decoder, folder = saved
    same = make_engine(decoder, SPEC)
    restore_state(same, folder, requests=False)
    small = make_engine(decoder, SPEC.replace(kv_budget_gib=0.0001))
    got = restore_state(small, folder, requests=False)
    assert got["dropped_requests"] == 1 and not small.requests
    assert got["dropped_tokens"] > 0 and got["tokens"] > 0
    check_invariants(small.cache)
    # The same eviction in place, on the same-size restore: the same nodes survive.
    ps = SPEC.page_size
    full_over = same.cache.full_evictable - small.ledger.primary_pages * ps
    swa_over = same.cache.sizes.swa_evictable - small.ledger.swa_pages * ps
    before = same.cache.full_evictable
    same.cache.evict(max(0, full_over), max(0, swa_over))
    same.flush()
    assert _paths(small.cache) == _paths(same.cache)
    assert got["dropped_tokens"] == before - same.cache.full_evictable
    # The newest conversation's prefix is kept and read back: as the same-size engine reads it.
    a, b = _follow_up(small), _follow_up(same)
    _same_follow_up(a, b)
    assert a[1] > 0
    check_clean(small)
    check_clean(same)


def test_larger_pools_drop_nothing(saved):
    decoder, folder = saved
    big = make_engine(decoder, SPEC.replace(kv_budget_gib=0.004))
    got = restore_state(big, folder, requests=False)
    assert got["dropped_tokens"] == 0 and got["tokens"] > 0
    same = make_engine(decoder, SPEC)
    restore_state(same, folder, requests=False)
    assert _paths(big.cache) == _paths(same.cache)
    check_invariants(big.cache)
    _same_follow_up(_follow_up(big), _follow_up(same))
    check_clean(big)


def test_other_sizes_need_the_prefix_cache_alone(saved):
    decoder, folder = saved
    with pytest.raises(InputError, match="another engine: pools"):
        restore_state(make_engine(decoder, SPEC.replace(kv_budget_gib=0.0001)), folder)
    with pytest.raises(InputError, match="another engine: .*pools"):  # another page size
        restore_state(make_engine(decoder, SPEC.replace(page_size=8)), folder, requests=False)


@pytest.mark.parametrize(
    "fixture, setting, small_gib",
    [("mistral", {}, 0.00005), ("gpt_oss", dict(hybrid_memory=False), 0.0001)],
    ids=["all-swa", "single-pool"],
)
def test_one_pool_layouts_keep_the_most_recent_prefixes(fixture, setting, small_gib, tmp_path):
    """All-SWA pools (tombstones hold no KV: the SWA LRU frees it) and a single pool: the same
    nodes as evicting in place, the newest prefix read back, nothing leaked."""
    decoder = load_decoder(FIXTURES / fixture)
    spec = SPEC.replace(**setting)
    engine = make_engine(decoder, spec)
    for i in range(8):
        engine.add_request(_prompt(i), GREEDY)
        engine.run()
    engine.snapshot(tmp_path / "snap")
    same = make_engine(decoder, spec)
    same.restore(tmp_path / "snap", requests=False)
    small = make_engine(decoder, spec.replace(kv_budget_gib=small_gib))
    got = small.restore(tmp_path / "snap", requests=False)
    assert got["dropped_tokens"] > 0 and got["tokens"] > 0
    check_invariants(small.cache)
    capacity = small.ledger.primary_pages * spec.page_size
    live = same.cache.swa_evictable if small.sizes.mode.value == "all_swa" else None
    if live is not None and same.cache.swa:
        same.cache.evict(0, max(0, live - capacity))
    else:
        same.cache.evict(max(0, same.cache.full_evictable - capacity), 0)
    same.flush()
    assert _paths(small.cache) == _paths(same.cache)
    a, b = _follow_up(small), _follow_up(same)
    _same_follow_up(a, b)
    check_clean(small)
    check_clean(same)
