"""Recording what actually ran: overlap scheduling and speculative decoding change when the
host learns a step's slots, not what the allocator is asked; the trace puts each allocation
where the device made it (its step's launch), says in its header what ran, and replays.

Here through the null model (the `record` command); through a real model in
tests/serving/test_overlap.py (a stop token ending a request while the step planned after it
runs, an abort between steps, a read that fails and is rolled back) and
tests/serving/test_speculative.py (drafts always right and always wrong).
"""

import json
import re

import pytest
from helpers.engine_checks import check_clean

from swajax import sizing
from swajax.api import engine_for
from swajax.cli.main import main
from swajax.errors import InputError
from swajax.presets import load_preset
from swajax.serving.null_model import NullModel
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams
from swajax.trace.check import check_header
from swajax.trace.replay import replay

PROMPTS = [[(5 * i + 7 * j) % 120 + 1 for i in range(12 + 11 * j)] for j in range(5)]
PROMPTS.append(PROMPTS[3][:30] + [4, 5, 6])  # a prefix hit


def header(path) -> dict:
    with open(path) as f:
        return json.loads(f.readline())


@pytest.mark.parametrize(
    "flags, overlap, k",
    [
        (["--overlap"], True, 0),
        (["--num-speculative-tokens", "3", "--acceptance", "0.5"], False, 3),
    ],
)
def test_record_says_what_ran_and_replays(tmp_path, capsys, flags, overlap, k):
    path = tmp_path / "t.jsonl"
    assert main(["record", "--requests", "8", *flags, "--out", str(path)]) == 0
    assert "operations" in capsys.readouterr().out
    ran = header(path)["ran"]
    assert ran["overlap"] is overlap and (ran["launched_ahead"] > 0) is overlap
    assert ran["speculative_tokens"] == k and (ran["accepted_tokens"] > 0) is (k > 0)
    assert replay(path)["ok"]


def null_engine(overlap, steps=1, tokens=600):
    cfg = load_preset("tiny-hybrid")
    sizes = sizing.solve_pool_sizes(cfg, tokens, ratio=0.5, page_size=4)  # tight: evictions
    options = EngineOptions(chunk_size=16, max_context=400, eviction_interval=1, decode_steps=steps)
    return engine_for(cfg, NullModel(overlap=overlap), sizes, options)


def test_the_null_models_overlap_changes_no_token():
    """Plain steps and multi-step rounds (N = 8), each with and without overlap; a stop token
    ends one request inside a round that another was launched after."""
    outputs = []
    stop = ()
    for steps, overlap in ((1, False), (1, True), (8, False), (8, True)):
        engine = null_engine(overlap, steps, tokens=600 if steps == 1 else 1600)
        params = SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=stop)
        rids = [engine.add_request(p * 4, params) for p in PROMPTS]
        engine.run()
        check_clean(engine)
        assert (engine.launched_ahead > 0) is overlap
        outputs.append([engine.requests[r].output for r in rids])
        if not stop:  # from the first run on: a token one request samples mid-way
            stop = (outputs[0][2][11],)
            outputs[0] = [o[: o.index(stop[0]) + 1] if stop[0] in o else o for o in outputs[0]]
        if overlap and steps > 1:
            assert engine.scheduler.dropped_tokens > 0  # a round launched after the stop
    assert all(out == outputs[0] for out in outputs[1:])


@pytest.mark.parametrize(
    "ran, message",
    [
        ([], "ran must be an object"),
        ({"overlap": 1}, "ran.overlap must be true or false"),
        ({"launched_ahead": -1}, "ran.launched_ahead must be an integer"),
        ({"warp": True}, "fields among"),
    ],
)
def test_a_malformed_ran_is_refused(ran, message):
    init = dict(
        op="init",
        version=3,
        profile="lean",
        page_size=4,
        full_size=64,
        swa_size=64,
        mode="hybrid",
        window=8,
        cap_leaf_to_window=True,
        ops=0,
        ran=ran,
    )
    with pytest.raises(InputError, match=message):
        check_header(init, "t.jsonl")


@pytest.mark.parametrize("flags", [[], ["--overlap"]])
def test_the_host_runner_hands_out_the_device_allocators_slots(tmp_path, flags):
    """`record` runs the null model on the host runner (numpy allocator); replaying its trace
    on the jitted device allocator gives back every recorded slot and free count exactly, not
    only up to a renumbering of pages. (A speculative run's trace replays through the page
    bijection only, on the device runner before this one as now: its pages are numbered
    differently from the first round that frees rejected positions.)"""
    from swajax.trace.replay import read_lines

    path = tmp_path / "t.jsonl"
    assert main(["record", "--requests", "8", *flags, "--out", str(path)]) == 0
    answers = []
    assert replay(path, answers=answers)["ok"]
    lines = [line for line in read_lines(path)[1:] if not line.get("dropped")]
    allocations = 0
    for line, answer in zip(lines, answers, strict=True):
        if line["op"].startswith("alloc"):
            allocations += 1
            assert answer["slots"] == line["expect"]["slots"], line["op"]
            assert answer["available"] == line["expect"]["available"]
    assert allocations > 8


@pytest.mark.parametrize("command", ["record", "simulate"])
def test_a_run_in_which_every_request_was_rejected_is_an_error(tmp_path, capsys, command):
    """Pools too small for any prompt: no trace of nothing (which would "agree" with every
    backend on all 0 operations), and the error names the limit and how many were refused."""
    out = tmp_path / "t.jsonl"
    argv = [command, "--preset", "tiny-hybrid", "--workload", "long-context", "--requests", "3"]
    argv += ["--kv-budget-gib", "0.0001"] + (["--out", str(out)] if command == "record" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "every request (3) was rejected" in err and "--kv-budget-gib" in err
    assert not out.exists()


def test_record_counts_what_ran_and_what_was_rejected(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    argv = ["record", "--preset", "tiny-hybrid", "--workload", "mixed", "--requests", "6"]
    assert main([*argv, "--out", str(out)]) == 0
    line = capsys.readouterr().out
    ran, rejected = map(int, re.search(r"(\d+) requests ran, (\d+) rejected", line).groups())
    assert ran > 0 and rejected > 0  # the mixed workload's longest prompts outgrow these pools
