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
    time, against the kit's operation cases exported under its profile: at least nine in ten
    of at least twenty caught, the survivors exactly the listed ones."""
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
    assert len(caught) >= 20 and 1 - len(survivors) / len(caught) >= 0.9, caught
