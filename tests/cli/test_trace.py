"""Trace record / replay: a recorded run replays exactly; a changed result is found."""

import gzip
import json

import pytest

from swajax.cli.main import main
from swajax.trace.replay import replay


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "trace.jsonl"
    assert main(["record", "--requests", "8", "--out", str(path)]) == 0
    return path


def test_recorded_run_replays(trace, capsys):
    ops = {json.loads(line)["op"] for line in trace.read_text().splitlines()}
    assert {"init", "match", "lock", "alloc_extend", "alloc_decode", "cache_finished"} <= ops
    result = replay(trace)
    lines = trace.read_text().splitlines()
    assert json.loads(lines[-1]) == {"op": "end", "ops": len(lines) - 2}
    assert result["ok"] and result["ops"] == len(lines) - 2
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


def test_header_names_version_config_and_profile(trace):
    header = json.loads(trace.read_text().splitlines()[0])
    assert header["version"] == 3 and header["profile"] == "lean"  # the default profile
    assert header["config"] == {"model_type": "gpt_oss", "kinds": "SFSF"}  # tiny-hybrid


def test_gzip_and_version_2_replay(trace, tmp_path):
    from swajax.trace.replay import read_lines

    zipped = tmp_path / "t.jsonl.gz"
    zipped.write_bytes(gzip.compress(trace.read_bytes()))
    assert replay(zipped)["ok"]
    # version 2: plain lists, no config, profile or footer
    header, *ops = read_lines(trace)
    old = {k: v for k, v in header.items() if k not in ("config", "profile")} | {"version": 2}
    v2 = tmp_path / "v2.jsonl"
    v2.write_text("".join(json.dumps(line) + "\n" for line in [old, *ops]))
    assert replay(v2) == replay(trace)


def test_truncation_is_reported(trace, tmp_path):
    from swajax.trace.check import TraceError

    lines = trace.read_text().splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:-1]) + "\n")  # the footer lost: cut at a line boundary
    with pytest.raises(TraceError, match="truncated: no 'end' line"):
        replay(cut)
    data = gzip.compress(trace.read_bytes())
    cut_gz = tmp_path / "cut.jsonl.gz"
    cut_gz.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated"):
        replay(cut_gz)


def _trace_bytes(prompt_len, tmp_path):
    from swajax import sizing
    from swajax.api import engine_for
    from swajax.presets import load_preset
    from swajax.serving.null_model import NullModel
    from swajax.serving.options import EngineOptions
    from swajax.serving.sampling_params import SamplingParams
    from swajax.trace.recorder import Tracer

    cfg = load_preset("tiny-hybrid")
    sizes = sizing.solve_pool_sizes(cfg, 20_000, ratio=0.5, page_size=4)
    engine = engine_for(cfg, NullModel(), sizes, EngineOptions(chunk_size=256, max_context=20_000))
    tracer = Tracer(engine)
    engine.add_request(
        [7 + i % 900 for i in range(prompt_len)], SamplingParams(temperature=0.0, max_tokens=4)
    )
    engine.run()
    path = tmp_path / f"{prompt_len}.jsonl"
    tracer.write(path)
    assert replay(path)["ok"]
    return path.stat().st_size


def test_size_grows_linearly_with_the_prompt(tmp_path):
    """Written plainly, each of a prompt's n / 256 chunks repeats its whole token and slot
    lists, so doubling the prompt quadruples the file; delta-encoded it doubles."""
    small, large = _trace_bytes(8192, tmp_path), _trace_bytes(16384, tmp_path)
    assert large / small < 2.3


def _permuted_backend(init):
    """swajax with another free-list order: pages come off the full stack highest first."""
    from swajax.trace.replay import swajax_backend

    alloc, cache = swajax_backend(init)
    alloc.full.pages = alloc.full.pages[::-1].copy()
    return alloc, cache


def test_another_page_order_replays_through_the_bijection(trace):
    assert replay(trace, backend=_permuted_backend)["ok"]


def test_a_leaked_page_is_caught_at_its_operation(trace):
    """A backend that forgets one page of its 5th free (most frees happen inside cache
    operations): the free counts part at that operation, and replay names it."""
    from swajax.trace.replay import swajax_backend

    seen = {"ops": 0, "free_calls": 0, "leak_op": None}

    def leaky(init):
        alloc, cache = swajax_backend(init)
        free, available = alloc.free, alloc.available

        def leaky_free(slots):
            seen["free_calls"] += 1
            if seen["free_calls"] == 5 and len(slots) > 0:
                seen["leak_op"] = seen["ops"] + 1  # replay observes once after each operation
                slots = slots[: -init["page_size"]]  # the last page stays allocated
            free(slots)

        def counted():
            seen["ops"] += 1
            return available()

        alloc.free, alloc.available = leaky_free, counted
        return alloc, cache

    result = replay(trace, backend=leaky)
    assert seen["leak_op"] is not None
    assert not result["ok"] and result["op_number"] == seen["leak_op"]
    assert "available" in result["fields"] or "sizes" in result["fields"]


def test_replay_cli_takes_a_backend(trace, capsys):
    assert main(["replay", str(trace), "--backend", "tests.cli.test_trace:_permuted_backend"]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["replay", str(trace), "--backend", "nowhere:factory"]) == 2
    assert "cannot load it" in capsys.readouterr().err


def _presets():
    from swajax.presets import PRESETS, load_preset

    return [name for name in sorted(PRESETS) if load_preset(name).sliding_window]


@pytest.mark.parametrize(
    "preset, profile",
    [
        pytest.param(preset, profile, marks=[] if preset == "tiny-hybrid" else pytest.mark.slow)
        for preset in _presets()
        for profile in ("swajax", "sglang-0.5.23")
    ],
)
def test_record_replay_round_trip(preset, profile, tmp_path):
    """Every preset with sliding layers, under every cache-policy profile (tiny-hybrid by
    default, the rest with -m slow): the replay rebuilds the recorded profile's cache."""
    path = tmp_path / "t.jsonl.gz"
    budget = "0.002" if preset.startswith("tiny") else "8"  # Llama 4: chunk 8192
    assert (
        main(
            [
                "record",
                "--preset",
                preset,
                "--requests",
                "6",
                "--cache-policy",
                profile,
                "--kv-budget-gib",
                budget,
                "--out",
                str(path),
            ]
        )
        == 0
    )
    from swajax.trace.replay import read_lines

    assert read_lines(path)[0]["profile"] == profile
    assert replay(path)["ok"]
