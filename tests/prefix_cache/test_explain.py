"""A match explains itself: scripted scenarios whose reason is known, on the tree and through
the engine."""

import json
import sys

import numpy as np
import pytest

from swajax.memory.host_allocator import HostAllocator
from swajax.prefix_cache import RadixCache, explain
from swajax.prefix_cache.chunk import ChunkCache


def tree(ps=1, window=4, full=256, swa=128):
    alloc = HostAllocator(full, swa, ps)
    return alloc, RadixCache(alloc, page_size=ps, window=window)


def insert(alloc, cache, tokens, evicted=0):
    status, slots = alloc.alloc_extend([0], [len(tokens)], [-1])
    assert status == 0
    cache.insert(tokens, slots, swa_evicted_seqlen=evicted)


def test_a_tombstone_inside_the_window_names_the_eviction_that_made_it():
    alloc, cache = tree()
    base = list(range(1, 13))
    insert(alloc, cache, base + [50, 51, 52, 53])
    insert(alloc, cache, base + [60, 61, 62, 63])  # [0, 12) is now an inner node
    cache.match(base + [50, 51, 52, 53])
    cache.match(base + [60, 61, 62, 63])  # both leaves more recent than their parent
    cache.evict(0, 0)  # eviction #1 frees nothing
    cache.evict(0, 12)  # eviction #2 tombstones the inner node (a leaf would go whole)
    report = cache.match(base + [70]).report
    assert (report.matched, report.full_match, report.stop) == (0, 12, explain.SWA_TOMBSTONE)
    assert report.tombstone == (0, 12) and report.cause == 2
    assert "eviction #2" in report.describe() and "[0, 12)" in report.describe()


def test_a_deleted_page_is_remembered_as_evicted_not_as_never_cached():
    alloc, cache = tree()
    insert(alloc, cache, list(range(1, 17)))
    cache.evict(16, 0)  # eviction #1 deletes the whole leaf
    report = cache.match(list(range(1, 17))).report
    assert (report.matched, report.stop, report.cause) == (0, explain.FULL_EVICTED, 1)
    # Re-inserted in part, the path ends inside what was deleted: still evicted, not absent.
    insert(alloc, cache, list(range(1, 9)))
    report = cache.match(list(range(1, 17))).report
    assert (report.matched, report.stop, report.cause) == (8, explain.FULL_EVICTED, 1)
    assert cache.match([99, 98, 97, 96]).report.stop == explain.NO_ENTRY


def test_a_partial_page_is_page_alignment():
    alloc, cache = tree(ps=4)
    insert(alloc, cache, list(range(1, 17)))
    report = cache.match(list(range(1, 19))).report
    assert (report.asked, report.cacheable, report.matched) == (18, 16, 16)
    assert report.stop == explain.PAGE_ALIGNMENT and report.missed == 2
    assert cache.match(list(range(1, 17))).report.stop == explain.COMPLETE


def test_a_prefix_inserted_without_its_swa_names_the_requests_own_eviction():
    alloc, cache = tree()
    tokens = list(range(1, 17))
    status, slots = alloc.alloc_extend([0], [16], [-1])
    alloc.free_swa(slots[:8])  # the request's runtime window eviction, before it is cached
    cache.insert(tokens, slots, swa_evicted_seqlen=8)  # [0, 8) goes in as a tombstone
    report = cache.match(tokens[:8] + [77]).report
    assert report.stop == explain.SWA_TOMBSTONE and report.cause == explain.INSERTED
    assert "before it was cached" in report.describe()


def test_forgotten_deletions_read_as_never_cached():
    alloc, cache = tree()
    cache.ghosts = explain.Ghosts(capacity=8)
    first, second = list(range(1, 9)), list(range(21, 29))
    insert(alloc, cache, first)
    cache.evict(8, 0)
    insert(alloc, cache, second)
    cache.evict(8, 0)  # its 8 pages push the first's out
    assert cache.match(second).report.stop == explain.FULL_EVICTED
    report = cache.match(first).report
    assert report.stop == explain.NO_ENTRY and report.cause is None


def test_the_chunk_cache_is_the_policy():
    cache = ChunkCache(HostAllocator(64, 64, 1), page_size=1, window=4)
    report = cache.match([1, 2, 3]).report
    assert report.stop == explain.POLICY and report.missed == 3


@pytest.mark.parametrize("ps", [1, 4])
def test_reports_agree_with_the_match(ps):
    """Whatever happened before, a report's numbers are the match's own."""
    rng = np.random.default_rng(ps)
    alloc, cache = tree(ps=ps, window=8, full=512, swa=256)
    for _ in range(60):
        tokens = rng.integers(1, 4, size=int(rng.integers(4, 40))).tolist()
        if rng.random() < 0.5:
            n = len(tokens) // ps * ps
            if n and alloc.available()[0] >= n + 64:
                insert(alloc, cache, tokens[:n])
        if rng.random() < 0.3:
            cache.evict(int(rng.integers(0, 32)), int(rng.integers(0, 32)))
        match = cache.match(tokens)
        r = match.report
        assert r.matched == len(match) and r.full_match == match.full_length
        assert r.cacheable == len(tokens) // ps * ps and r.stop in explain.REASONS
        assert (r.stop == explain.SWA_TOMBSTONE) == (r.full_match > r.matched)


def test_llm_outputs_carry_the_report():
    from swajax import LLM, SamplingParams

    llm = LLM("tiny", max_running_requests=2)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    prompt = "def fibonacci(n):\n    " * 8
    first, second = (llm.generate(prompt, params)[0] for _ in range(2))
    assert first.prefix_cache["stop"] == explain.NO_ENTRY and first.prefix_cache["matched"] == 0
    assert second.prefix_cache["matched"] == second.num_cached_tokens > 0
    assert second.prefix_cache["stop"] in (explain.COMPLETE, explain.PAGE_ALIGNMENT)
    assert (
        second.prefix_cache["missed"] == len(second.prompt_token_ids) - 1 - second.num_cached_tokens
    )
    assert llm.engine.scheduler.missed_tokens[explain.NO_ENTRY] >= first.prefix_cache["missed"]


def test_explain_names_evictions_in_a_recorded_trace(cli, tmp_path):
    trace = tmp_path / "t.jsonl"
    args = ["--preset", "tiny-hybrid", "--kv-budget-gib", "0.0006", "--requests", "16"]
    code, _, err = cli("record", *args, "--swa-full-tokens-ratio", "0.15", "--out", trace)
    assert code == 0, err
    code, out, _ = cli("explain", trace, "--json")
    result = json.loads(out)
    assert code == 0 and result["ok"]
    stops = {m["stop"] for m in result["matches"]}
    assert {explain.FULL_EVICTED, explain.SWA_TOMBSTONE} <= stops
    named = [m for m in result["matches"] if m["stop"] == explain.FULL_EVICTED]
    assert all(m["cause"] >= 1 and f"eviction #{m['cause']}" in m["reason"] for m in named)
    assert sum(result["missed"].values()) == sum(m["missed"] for m in result["matches"])
    code, out, _ = cli("explain", trace)
    lines = out.splitlines()
    summary = next(i for i, line in enumerate(lines) if line.endswith("tokens matched"))
    assert summary == len(result["matches"]) and lines[summary].startswith(f"{summary} matches")
    assert any(line.strip().endswith(": full_evicted") for line in lines[summary + 1 :])


def test_a_deep_path_is_explained_in_constant_stack():
    """Regression: the path hash recursed once per node and overflowed Python's stack on paths
    past ~1,000 nodes (a long multi-turn chain at page size 1). Here 400 nodes under a
    recursion limit of 300."""
    alloc, cache = tree(full=1024, swa=1024)
    tokens, slots = [], np.zeros(0, np.int32)
    for i in range(400):  # one node per insert: each is one token longer
        tokens.append(i + 1)
        slots = np.concatenate([slots, alloc.alloc_extend([0], [1], [-1])[1]])
        cache.insert(list(tokens), slots)
    assert sum(1 for _ in cache.nodes()) == 400
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(300)
    try:
        assert cache.match(tokens + [5000]).report.stop == explain.NO_ENTRY
        cache.evict(400, 0)  # deletes the chain leaf by leaf: every page remembered
    finally:
        sys.setrecursionlimit(limit)
    report = cache.match(tokens).report
    assert report.stop == explain.FULL_EVICTED and report.cause == 1
