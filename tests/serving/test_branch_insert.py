"""The branch-insert rule of the sglang-0.5.23 profile (`prefix_cache/policy.py`, rule 4): a
request admitted with full KV matched beyond its SWA-valid hit holds that point; the first
insert that reaches it stops there and drops it. SGLang checkpoints every prefill's last chunk,
a retracted request's recomputation included, so no finishing insert is ever cut. The trace is
the one SGLang's peer run found diverging (issue h25: Step-3.5-Flash shapes, page 16, chunk 512,
1 GiB, a retraction and a re-admission with a tail miss); its replay through SGLang itself is
under `-m sglang` (tests/peers/test_sglang.py)."""

from __future__ import annotations

import pytest

from swajax.cli.main import main
from swajax.prefix_cache.requests import RequestCaching, branch_end
from swajax.serving.scheduler import Scheduler
from swajax.trace.replay import read_lines, replay

H25 = [
    "record",
    "--cache-policy",
    "sglang-0.5.23",
    "--preset",
    "step-3.5-flash",
    "--workload",
    "multi-turn",
    "--requests",
    "16",
    "--page-size",
    "16",
    "--chunk-size",
    "512",
    "--kv-budget-gib",
    "1",
    "--seed",
    "205",
]


def _record(path) -> list[dict]:
    assert main([*H25, "--out", str(path)]) == 0
    return read_lines(path)


def _cut_inserts(lines) -> list[int]:
    """Line numbers of request inserts that a branch point cut."""
    return [
        number
        for number, line in enumerate(lines[1:], 1)
        if line["op"] in ("cache_finished", "cache_unfinished")
        and line.get("insert", True)
        and branch_end(
            len(line["tokens"]) // 16 * 16,
            line["cache_protected_len"],
            line.get("swa_branching_seqlen"),
        )
        is not None
    ]


def _finishing(lines, numbers) -> list[int]:
    return [n for n in numbers if lines[n]["op"] == "cache_finished"]


@pytest.fixture(scope="module")
def h25_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("h25") / "h25.jsonl"
    _record(path)
    return path


@pytest.fixture(scope="module")
def h25(h25_path) -> list[dict]:
    return read_lines(h25_path)


def test_the_h25_trace_has_what_it_is_for(h25):
    """A retraction, a tail miss, and branch points that cut chunk checkpoints."""
    ops = h25[1:]
    assert any(x["op"] == "cache_finished" and not x.get("insert", True) for x in ops)
    assert any(x["op"] == "match" and x["expect"]["tail_miss"] > 0 for x in ops)
    assert _cut_inserts(h25), "no insert stopped at a branch point"


def test_no_finishing_insert_is_cut_by_a_branch_point(h25, h25_path):
    """Every prefill's last chunk is checkpointed, so the branch point is always reached before
    the request finishes; the trace replays through swajax's own cache as recorded."""
    assert _finishing(h25, _cut_inserts(h25)) == []
    assert replay(h25_path)["ok"]


def _before_the_fix(monkeypatch):
    """The scheduler as it was: a request checkpointed after its last prefill chunk only when
    that chunk sampled its first output token."""
    cache_chunk = Scheduler._cache_chunk

    def before(self, req):
        if req.decoding and len(req.output) != 1:
            return None
        return cache_chunk(self, req)

    monkeypatch.setattr(Scheduler, "_cache_chunk", before)


def test_without_the_last_chunk_checkpoint_a_finish_is_cut(tmp_path, monkeypatch):
    """Negative control: the scheduler as it was (no checkpoint after the last prefill chunk
    of a request that already had output, a retracted one's recomputation) leaves the
    re-admitted request's branch point to its finishing insert."""
    _before_the_fix(monkeypatch)
    lines = _record(tmp_path / "before.jsonl")
    assert _finishing(lines, _cut_inserts(lines))


def test_a_finishing_insert_stops_at_the_branch_point(tmp_path, monkeypatch):
    """The cache's half of the rule: a finishing insert given a branch point it reaches
    caches up to it and frees the rest (the replay of the control's trace through swajax's
    cache agrees with what was recorded, and a cache that ignores the point does not)."""
    _before_the_fix(monkeypatch)
    path = tmp_path / "before.jsonl"
    _record(path)
    monkeypatch.undo()
    assert replay(path)["ok"]
    finished = RequestCaching.cache_finished

    def ignores_the_point(self, *args, swa_branching_seqlen=None, **kwargs):
        return finished(self, *args, **kwargs)

    monkeypatch.setattr(RequestCaching, "cache_finished", ignores_the_point)
    result = replay(path)
    assert not result["ok"] and result["op"] in ("cache_finished", "match", "evict"), result
