"""The sglang-0.5.23 profile against SGLang 0.5.23 itself: traces recorded by swajax's engine
under that profile, replayed op by op through SGLang's own allocator and unified radix tree
(`sglang_adapter.py`); every operation must agree (slots through the page bijection, free
counts, evictable / protected sizes, match and tail lengths, eviction counts, handles).

Not part of the default run (marker `sglang`): it needs SGLang's environment, built by
`bash tests/peers/setup_sglang.sh` (or named by SWAJAX_SGLANG_PYTHON). Then:

    .venv/bin/python -m pytest -m sglang tests/peers
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang
HERE = Path(__file__).resolve().parent
DEFAULT_ENV = HERE.parents[1] / ".venvs" / "sglang"
SGLANG_PYTHON = Path(os.environ.get("SWAJAX_SGLANG_PYTHON", DEFAULT_ENV / "bin" / "python"))

# (preset, page size, workload, KV GiB, requests, seed). tiny-hybrid's window 7 divides no page
# size but 1, tiny-mimo's 8 divides 1 and 4, gpt-oss-120b's 127 none; 0.0005 GiB oversubscribes
# the tiny presets (LRU eviction, retraction, tombstones, revival), 0.002 does not.
CASES = [
    *[
        (p, ps, "multi-turn", gib, 12, seed)
        for p in ("tiny-hybrid", "tiny-mimo")
        for ps in (1, 4, 16, 64)
        for gib, seed in ((0.002, 0), (0.0005, 0), (0.0005, 1))
    ],
    ("tiny-hybrid", 4, "long-context", 0.05, 3, 0),  # 16-32K prompts in 64-token chunks
    ("tiny-mimo", 64, "long-context", 0.05, 3, 0),
    ("tiny-hybrid", 16, "mixed", 0.05, 8, 2),
    ("tiny-hybrid", 4, "shared-prefix", 0.0005, 40, 0),  # full eviction with leaves to choose
    ("tiny-mimo", 16, "shared-prefix", 0.0005, 40, 1),
    *[
        ("gpt-oss-120b", ps, "multi-turn", gib, 12, 0)
        for ps, gib in ((1, 0.1), (4, 0.1), (16, 0.1), (64, 0.05))
    ],
]
# Recorded with overlap scheduling and with speculative rounds (k + 1 positions, rejected pages
# freed): the allocations where the device made them, the same calls SGLang's objects take.
SPEC = ("--num-speculative-tokens", "3", "--acceptance", "0.6")
CASES += [
    ("tiny-hybrid", 4, "multi-turn", 0.0005, 12, 0, ("--overlap",)),
    ("tiny-mimo", 1, "shared-prefix", 0.0005, 40, 0, ("--overlap",)),
    ("tiny-hybrid", 16, "multi-turn", 0.0005, 12, 1, SPEC),
    ("tiny-mimo", 4, "multi-turn", 0.002, 12, 2, ("--overlap", *SPEC)),
]


# All-SWA pools (tiny-all-swa: every layer slides, window 8) against SGLang's
# PureSWATokenToKVPoolAllocator (page size 1 only) and PureSWARadixCache, under the profile's
# prefill-floor rule: loose and oversubscribed budgets, shared prefixes, overlap, long outputs
# (reasoning: the window frees hundreds of decode positions above each floor).
CASES += [
    ("tiny-all-swa", 1, "multi-turn", 0.002, 12, 0),
    ("tiny-all-swa", 1, "multi-turn", 0.0005, 12, 0),
    ("tiny-all-swa", 1, "shared-prefix", 0.0005, 40, 0),
    ("tiny-all-swa", 1, "reasoning", 0.02, 4, 1),
    ("tiny-all-swa", 1, "multi-turn", 0.0005, 12, 1, ("--overlap",)),
]

# Every preset at its published shapes, page 16, chunk 512, a budget that retracts requests and
# makes re-admissions match with tail misses (the window cut the matched path): the scheduler's
# re-admission paths under the branch-insert rule. The step-3.5-flash case is issue h25's trace.
CHUNK = ("--chunk-size", "512")
READMISSIONS = [
    ("gpt-oss-20b", 16, "multi-turn", 0.05, 16, 205, CHUNK),
    ("gpt-oss-120b", 16, "multi-turn", 0.1, 16, 205, CHUNK),
    ("mimo-v2-flash", 16, "multi-turn", 0.15, 16, 205, CHUNK),
    ("gemma-3-27b", 16, "multi-turn", 1, 16, 205, CHUNK),
    ("gemma-4-31b", 16, "multi-turn", 1, 16, 205, CHUNK),
    ("gemma-4-26b-a4b", 16, "multi-turn", 1, 16, 205, CHUNK),
    ("gemma-4-e4b", 16, "multi-turn", 0.15, 16, 205, CHUNK),
    ("step-3.5-flash", 16, "multi-turn", 1, 16, 205, CHUNK),
    ("deepseek-v4-flash", 16, "multi-turn", 0.15, 16, 205, CHUNK),
    # Llama 4's 8192-token window slides only under long outputs.
    ("llama-4-scout", 16, "reasoning", 2.5, 6, 205, (*CHUNK, "--swa-full-tokens-ratio", "0.5")),
]
CASES += READMISSIONS


def _name(case) -> str:
    name = "{}_ps{}_{}_{}gib_n{}_s{}".format(*case[:6])
    if len(case) > 6:
        name += "_overlap" * ("--overlap" in case[6]) + "_spec" * (SPEC[0] in case[6])
    return name


def _record(folder: Path, case, policy: str = "sglang-0.5.23") -> Path:
    preset, ps, workload, gib, n, seed, *flags = case
    out = folder / f"{_name(case)}.jsonl.gz"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "swajax",
            "record",
            "--preset",
            preset,
            "--page-size",
            str(ps),
            "--workload",
            workload,
            "--kv-budget-gib",
            str(gib),
            "--requests",
            str(n),
            "--seed",
            str(seed),
            "--cache-policy",
            policy,
            "--out",
            str(out),
            *(flags[0] if flags else ()),
        ],
        check=True,
        capture_output=True,
        timeout=900,
    )
    return out


@pytest.fixture(scope="module")
def sglang_results(tmp_path_factory) -> dict[str, dict]:
    if not SGLANG_PYTHON.exists():
        pytest.skip(f"no SGLang environment at {SGLANG_PYTHON}: bash tests/peers/setup_sglang.sh")
    folder = tmp_path_factory.mktemp("sglang_traces")
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        traces = list(pool.map(lambda case: _record(folder, case), CASES))
    run = subprocess.run(
        [str(SGLANG_PYTHON), str(HERE / "replay_in_sglang.py"), *map(str, traces)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    results = {}
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            results[Path(result["trace"]).name.removesuffix(".jsonl.gz")] = result
    assert results, f"the SGLang replay printed nothing:\n{run.stderr[-3000:]}"
    return results


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_sglang_agrees_op_for_op(sglang_results, case):
    result = sglang_results[_name(case)]
    assert result["ok"], json.dumps(result)[:2000]
    assert result["ops"] > 500, "a trace this short exercises too little"


@pytest.mark.parametrize("case", READMISSIONS, ids=_name)
def test_readmission_cases_retract_and_miss_tails(sglang_results, case):
    """Each re-admission case does what it is there for: a request retracted, a match whose
    tail the window cut, and a branch point handed to the cache."""
    from swajax.trace.replay import read_lines

    lines = read_lines(sglang_results[_name(case)]["trace"])[1:]
    assert any(x["op"] == "cache_finished" and not x.get("insert", True) for x in lines)
    assert any(x["op"] == "match" and x["expect"]["tail_miss"] > 0 for x in lines)
    assert any("swa_branching_seqlen" in x for x in lines)


def test_h25_before_the_fix_diverges_from_sglang(tmp_path, monkeypatch):
    """Negative control for issue h25: swajax as it was (no checkpoint after a re-admitted
    request's last prefill chunk, the finishing insert taking the whole sequence) records the
    h25 workload; SGLang, handed the request's branch point, cuts the finishing insert there,
    and the replay says where the two part."""
    if not SGLANG_PYTHON.exists():
        pytest.skip(f"no SGLang environment at {SGLANG_PYTHON}: bash tests/peers/setup_sglang.sh")
    from swajax.cli.main import main
    from swajax.prefix_cache.requests import RequestCaching
    from swajax.serving.scheduler import Scheduler

    cache_chunk, finished = Scheduler._cache_chunk, RequestCaching.cache_finished
    monkeypatch.setattr(
        Scheduler,
        "_cache_chunk",
        lambda self, req: None if req.decoding and len(req.output) != 1 else cache_chunk(self, req),
    )
    monkeypatch.setattr(
        RequestCaching,
        "cache_finished",
        lambda self, *a, swa_branching_seqlen=None, **k: finished(self, *a, **k),
    )
    preset, ps, workload, gib, n, seed, flags = READMISSIONS[7]
    trace = tmp_path / "h25_before.jsonl"
    argv = ["record", "--cache-policy", "sglang-0.5.23", "--preset", preset]
    argv += ["--page-size", str(ps), "--workload", workload, "--kv-budget-gib", str(gib)]
    argv += ["--requests", str(n), "--seed", str(seed), *flags, "--out", str(trace)]
    assert main(argv) == 0
    run = subprocess.run(
        [str(SGLANG_PYTHON), str(HERE / "replay_in_sglang.py"), str(trace)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    result = json.loads(run.stdout.splitlines()[-1])
    assert not result["ok"] and "op_number" in result, result


def test_swajaxs_own_all_swa_rules_are_not_sglangs(tmp_path):
    """The check can fail: the same all-SWA workload recorded under swajax's rules (tombstones,
    the window hit rule, no prefill floor) diverges from SGLang's PureSWARadixCache."""
    if not SGLANG_PYTHON.exists():
        pytest.skip(f"no SGLang environment at {SGLANG_PYTHON}: bash tests/peers/setup_sglang.sh")
    trace = _record(tmp_path, ("tiny-all-swa", 1, "multi-turn", 0.0005, 12, 0), "swajax")
    run = subprocess.run(
        [str(SGLANG_PYTHON), str(HERE / "replay_in_sglang.py"), str(trace)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    result = json.loads(run.stdout.splitlines()[-1])
    assert not result["ok"] and "op_number" in result, result


def test_the_example_adapter_drives_sglang_through_the_kit(tmp_path):
    """`examples/kit_adapter.py`, written from the protocol alone, answers a kit exported
    under the sglang-0.5.23 rules with SGLang's objects; `examples/kit_checker.py` accepts
    every case, the boundary scripts and the all-SWA case (PureSWARadixCache) included."""
    if not SGLANG_PYTHON.exists():
        pytest.skip(f"no SGLang environment at {SGLANG_PYTHON}: bash tests/peers/setup_sglang.sh")
    kit, answers, examples = tmp_path / "kit", tmp_path / "answers", HERE.parents[1] / "examples"
    export = [
        sys.executable,
        "-m",
        "swajax",
        "conformance",
        "export",
        str(kit),
        "--cache-policy",
        "sglang-0.5.23",
    ]
    subprocess.run(export, check=True, capture_output=True)
    subprocess.run(
        [
            str(SGLANG_PYTHON),
            str(examples / "kit_adapter.py"),
            str(kit),
            str(answers),
            "--backend",
            "peers.sglang_adapter:op_backend",
        ],
        check=True,
        capture_output=True,
        cwd=HERE.parent,
        timeout=900,
    )
    run = subprocess.run(
        [sys.executable, str(examples / "kit_checker.py"), str(kit), str(answers)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    from swajax.conformance import kit as kit_lib

    assert run.stdout.count("OK") == kit_lib.NUM_OPS_CASES, run.stdout
    assert "SKIP" not in run.stdout, run.stdout


def test_the_kits_mutation_score_on_sglang(tmp_path):
    """Bugs planted in SGLang 0.5.23's own objects (tests/peers/sglang_mutants.py), one at a
    time, against the kit's operation cases exported under its profile: of at least twenty,
    at least 95% of those not equivalent in the protocol caught, the survivors exactly the
    listed ones."""
    if not SGLANG_PYTHON.exists():
        pytest.skip(f"no SGLang environment at {SGLANG_PYTHON}: bash tests/peers/setup_sglang.sh")
    from swajax.conformance import kit as kit_lib

    kit_lib.export(tmp_path, cache_policy="sglang-0.5.23", parts=("ops",))
    run = subprocess.run(
        [str(SGLANG_PYTHON), str(HERE / "sglang_mutants.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    *lines, last = map(json.loads, run.stdout.splitlines())
    caught = {line["mutant"]: line["caught"] for line in lines}
    survivors = {name for name, cases in caught.items() if not cases}
    assert survivors == set(last["listed_survivors"]), (survivors, last)
    equivalent = len(last["equivalent"])
    assert len(caught) >= 20, caught
    assert (len(caught) - len(survivors)) / (len(caught) - equivalent) >= 0.95, caught
