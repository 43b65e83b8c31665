"""Trace record / replay: a recorded run replays exactly; a changed result is found."""

import json

import pytest

from swajax.cli.main import main
from swajax.cli.trace import replay


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "trace.jsonl"
    assert main(["record", "--requests", "8", "--out", str(path)]) == 0
    return path


def test_recorded_run_replays(trace, capsys):
    ops = {json.loads(line)["op"] for line in trace.read_text().splitlines()}
    assert {"init", "match", "lock", "alloc_extend", "alloc_decode", "cache_finished"} <= ops
    result = replay(trace)
    assert result["ok"] and result["ops"] == len(trace.read_text().splitlines()) - 1
    assert main(["replay", str(trace)]) == 0 and "OK" in capsys.readouterr().out


def test_first_divergence_is_reported(trace, tmp_path, capsys):
    lines = trace.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if json.loads(line)["op"] == "alloc_decode")
    op = json.loads(lines[n])
    op["expect"]["slots"][0] += 1  # another backend handed out a different slot
    lines[n] = json.dumps(op)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    result = replay(bad)
    assert not result["ok"] and result["op_number"] == n and result["fields"] == ["slots"]
    assert main(["replay", str(bad), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["op_number"] == n


def test_trace_without_init(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"op": "match", "tokens": []}\n')
    assert main(["replay", str(path)]) != 0
    assert "init" in capsys.readouterr().err
