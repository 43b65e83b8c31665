"""The conformance kit: export, then run swajax's adapter (every case passes), the plain-Python
allocator model (every operation case passes, the rest is skipped) and a broken adapter (exactly
the cases it gets wrong fail)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FIXTURES
from helpers.conformance_adapters import PythonModelAdapter
from helpers.mutants import MUTANTS, SURVIVORS, MutantAdapter

from swajax.conformance import boundary, kit as kit_lib
from swajax.conformance.adapter import SwajaxAdapter, SwajaxPallasAdapter
from swajax.conformance.attention_cases import CASES

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SINK_CASES = {spec[0] for spec in CASES if spec[6]}
pytestmark = pytest.mark.xdist_group("conformance_kit")  # one worker exports the kit once


@pytest.fixture(scope="session")  # exported once even if the worker interleaves other modules
def kit(tmp_path_factory):
    from swajax.cli.main import main

    folder = tmp_path_factory.mktemp("kit")
    assert (
        main(["conformance", "export", str(folder), "--force", "--models", str(FIXTURES / "qwen3")])
        == 0
    )
    return folder


def _run(cli, kit, adapter):
    code, out, err = cli("conformance", "run", str(kit), "--adapter", adapter, "--json")
    return code, {r["name"]: r for r in json.loads(out)}


def test_manifest_and_files(kit):
    manifest = json.loads((kit / "manifest.json").read_text())
    kinds = [c["kind"] for c in manifest["cases"]]
    assert kinds.count("ops") == kit_lib.NUM_OPS_CASES and kinds.count("attention") == len(CASES)
    assert manifest["cache_policy"] == "lean"
    assert {c["name"] for c in manifest["cases"] if c["kind"] == "logits"} == {
        "logits_demo",
        "logits_qwen3",
    }
    import numpy as np

    case = np.load(kit / "attention" / "sliding_decode.npz")
    assert np.isnan(case["k_pages"][0]).all()  # the dummy page
    assert (case["page_table"] == 0).any()  # freed pages before the window
    assert case["expected"].dtype == np.float64


def test_swajax_passes_everything(cli, kit):
    code, results = _run(cli, kit, "swajax.conformance.adapter:SwajaxAdapter")
    assert code == 0 and all(r["status"] == "ok" for r in results.values()), results


@pytest.mark.slow  # the kernels are checked against the oracle by the attention tests already
def test_the_pallas_kernels_pass_the_attention_cases(tmp_path):
    """The README's second in-repo adapter: the kernels (interpret mode) on every attention
    case of a freshly exported kit."""
    kit_lib.export(tmp_path, parts=("attention",))
    results = kit_lib.run(tmp_path, SwajaxPallasAdapter())
    assert len(results) == len(CASES) and all(r.status == "ok" for r in results), results


def test_an_independent_allocator_passes_the_operation_cases(cli, kit):
    code, out, _ = cli(
        "conformance",
        "run",
        str(kit),
        "--adapter",
        "helpers.conformance_adapters:PythonModelAdapter",
    )
    assert code == 0 and f"{kit_lib.NUM_OPS_CASES} ok, 0 failed" in out  # the table's last line
    rows = [line.split() for line in out.splitlines()[:-1]]
    assert {r[0] for r in rows if r[1] == "ops"} == {"OK"}
    assert {r[0] for r in rows if r[1] != "ops"} == {"SKIPPED"}


def test_a_broken_adapter_fails_exactly_where_it_is_wrong(cli, kit):
    code, results = _run(cli, kit, "helpers.conformance_adapters:SinklessAdapter")
    failed = {name for name, r in results.items() if r["status"] == "fail"}
    assert code == 1 and failed == SINK_CASES
    assert "MISMATCH" in results["sliding_sinks"]["detail"]


def test_bad_kits(cli, kit, tmp_path):
    code, _, err = cli(
        "conformance", "run", str(tmp_path), "--adapter", "swajax.conformance.adapter:SwajaxAdapter"
    )
    assert code == 2 and "is not a conformance kit" in err
    code, _, err = cli("conformance", "export", str(kit))
    assert code == 2 and "not empty" in err


_CAUGHT: dict[str, list] = {}


def _caught(kit, name) -> list:
    """The operation cases a planted bug fails (each mutant run once per worker)."""
    if name not in _CAUGHT:
        results = kit_lib.run(kit, MutantAdapter(name))
        _CAUGHT[name] = [r for r in results if r.kind == "ops" and r.status == "fail"]
    return _CAUGHT[name]


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_every_planted_bug_is_caught_or_explained(kit, name):
    """A bug planted in a copy of the reference allocator / tree fails at least one operation
    case, which names the operation and the field that differed; a listed survivor survives
    (the list is not a place to hide a bug the kit should catch)."""
    failed = _caught(kit, name)
    if name in SURVIVORS:
        assert not failed, f"{name} is caught now: take it off SURVIVORS"
        return
    assert failed, f"{name}: no operation case caught it"
    assert all(re.match(r"operation \d+ \(\w+\) \[\w+(, \w+)*\]: ", r.detail) for r in failed), (
        failed
    )


def test_the_kits_mutation_score(kit):
    """At least 20 planted bugs; of those not equivalent in the protocol, at least 95% caught
    (the score is in benchmarks/README.md, "The kit's mutation score")."""
    caught = sum(bool(_caught(kit, name)) for name in MUTANTS)
    equivalent = sum(reason.startswith("equivalent") for reason in SURVIVORS.values())
    assert len(MUTANTS) >= 20, len(MUTANTS)
    assert caught / (len(MUTANTS) - equivalent) >= 0.95, (caught, len(MUTANTS), equivalent)


@pytest.mark.parametrize("policy", ["swajax", "sglang-0.5.23"])
def test_export_and_run_under_another_profile(tmp_path, policy):
    """The operation cases recorded under any profile pass swajax and the independent
    allocator model; the manifest and each trace name the profile."""
    manifest = kit_lib.export(tmp_path, cache_policy=policy, ops=kit_lib.OPS[:1], parts=("ops",))
    assert manifest["cache_policy"] == policy
    header = json.loads((tmp_path / manifest["cases"][0]["path"]).read_text().splitlines()[0])
    assert header["profile"] == policy
    for adapter in (PythonModelAdapter(), SwajaxAdapter()):
        assert [r.status for r in kit_lib.run(tmp_path, adapter)] == ["ok"]


def test_export_refuses_an_unknown_profile(cli, tmp_path):
    code, _, err = cli("conformance", "export", str(tmp_path), "--cache-policy", "vllm")
    assert code == 2 and "vllm" in err


def test_operation_cases_follow_the_published_schema(kit):
    import jsonschema

    schema = json.loads((kit / "ops.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    # The schema is a oneOf whose branches each require a distinct `op` constant, so a line
    # matches the oneOf exactly when it matches its own op's branch: validating against that
    # branch alone is the same check, without trying every other branch on 15,000 lines.
    branches = {b["properties"]["op"]["const"]: b for b in schema["oneOf"]}
    assert len(branches) == len(schema["oneOf"])
    assert all("op" in b["required"] for b in schema["oneOf"])
    head = {k: v for k, v in schema.items() if k != "oneOf"}
    validators = {op: jsonschema.Draft202012Validator({**head, **b}) for op, b in branches.items()}
    seen = set()
    for case in json.loads((kit / "manifest.json").read_text())["cases"]:
        if case["kind"] == "ops":
            for raw in (kit / case["path"]).read_text().splitlines():
                line = json.loads(raw)  # plain lists: no swajax codec needed
                validators[line["op"]].validate(line)
                seen.add(line["op"])
    assert len(seen) > len(branches) // 2  # the kit exercises most of the schema


def test_a_checker_written_from_the_protocol_alone(kit, tmp_path):
    """examples/kit_checker.py (standard library only) accepts an independent backend's
    answers and names the operation and field of a wrong one."""
    from swajax.trace.replay import replay

    manifest = json.loads((kit / "manifest.json").read_text())
    ops = [c for c in manifest["cases"] if c["kind"] == "ops"]
    for case in ops:
        answers = []
        assert replay(kit / case["path"], PythonModelAdapter().allocator_and_cache, answers)["ok"]
        text = "".join(json.dumps(a) + "\n" for a in answers)
        (tmp_path / f"{case['name']}.jsonl").write_text(text)
    checker = [sys.executable, str(EXAMPLES / "kit_checker.py"), str(kit), str(tmp_path)]
    run = subprocess.run(checker, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.count("OK") == len(ops), run.stdout + run.stderr
    wrong = tmp_path / f"{ops[0]['name']}.jsonl"
    answers = [json.loads(x) for x in wrong.read_text().splitlines()]
    answers[99]["available"][1] += 1  # one slot freed twice, say
    wrong.write_text("".join(json.dumps(a) + "\n" for a in answers))
    run = subprocess.run(checker, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "operation 100 (" in run.stdout and "[available]" in run.stdout


@pytest.mark.parametrize(
    "backend, ok", [("python_model", True), ("mutant_insert_leaks_duplicates", False)]
)
def test_an_adapter_written_from_the_protocol_alone(kit, tmp_path, backend, ok):
    """examples/kit_adapter.py (standard library only, written from the protocol document)
    drives a backend through every operation case; the checker accepts a correct backend's
    answers and refuses a buggy one's."""
    answers = tmp_path / "answers"
    adapter = [
        sys.executable,
        str(EXAMPLES / "kit_adapter.py"),
        str(kit),
        str(answers),
        "--backend",
        f"helpers.op_backend:{backend}",
    ]
    subprocess.run(
        adapter, check=True, capture_output=True, cwd=EXAMPLES.parent / "tests", timeout=300
    )
    checker = [sys.executable, str(EXAMPLES / "kit_checker.py"), str(kit), str(answers)]
    run = subprocess.run(checker, capture_output=True, text=True, timeout=300)
    assert (run.returncode == 0) is ok, run.stdout
    # The mutant passes the cases that hand back no slot past what the tree takes: all-SWA's
    # and the boundary scripts' that neither compute cached tokens again (the recency scripts,
    # `Script.again`) nor cut an insert at a branch point (the branch scripts).
    again = [n for n in boundary.SCRIPTS if any(k in n for k in ("lru", "recency", "branch"))]
    passing = kit_lib.NUM_OPS_CASES if ok else 1 + len(boundary.SCRIPTS) - len(again)
    assert run.stdout.count("OK") == passing, run.stdout
