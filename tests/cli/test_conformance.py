"""The conformance kit: export, then run swajax's adapter (every case passes), the plain-Python
allocator model (every operation case passes, the rest is skipped) and a broken adapter (exactly
the cases it gets wrong fail)."""

import json

import pytest
from helpers import FIXTURES

from swajax.conformance.attention_cases import CASES

SINK_CASES = {spec[0] for spec in CASES if spec[6]}


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    from swajax.cli.main import main

    folder = tmp_path_factory.mktemp("kit")
    assert main(["conformance", "export", str(folder), "--force",
                 "--models", str(FIXTURES / "qwen3")]) == 0  # fmt: skip
    return folder


def _run(cli, kit, adapter):
    code, out, err = cli("conformance", "run", str(kit), "--adapter", adapter, "--json")
    return code, {r["name"]: r for r in json.loads(out)}


def test_manifest_and_files(kit):
    manifest = json.loads((kit / "manifest.json").read_text())
    kinds = [c["kind"] for c in manifest["cases"]]
    assert kinds.count("ops") == 3 and kinds.count("attention") == len(CASES)
    assert {c["name"] for c in manifest["cases"] if c["kind"] == "logits"} == {
        "logits_demo", "logits_qwen3"}  # fmt: skip
    import numpy as np

    case = np.load(kit / "attention" / "sliding_decode.npz")
    assert np.isnan(case["k_pages"][0]).all()  # the dummy page
    assert (case["page_table"] == 0).any()  # freed pages before the window
    assert case["expected"].dtype == np.float64


def test_swajax_passes_everything(cli, kit):
    code, results = _run(cli, kit, "swajax.conformance.adapter:SwajaxAdapter")
    assert code == 0 and all(r["status"] == "ok" for r in results.values()), results


def test_an_independent_allocator_passes_the_operation_cases(cli, kit):
    code, out, _ = cli("conformance", "run", str(kit), "--adapter",
                       "helpers.conformance_adapters:PythonModelAdapter")  # fmt: skip
    assert code == 0 and "3 ok, 0 failed" in out  # the table's last line
    rows = [line.split() for line in out.splitlines()[:-1]]
    assert {r[0] for r in rows if r[1] == "ops"} == {"OK"}
    assert {r[0] for r in rows if r[1] != "ops"} == {"SKIPPED"}


def test_a_broken_adapter_fails_exactly_where_it_is_wrong(cli, kit):
    code, results = _run(cli, kit, "helpers.conformance_adapters:SinklessAdapter")
    failed = {name for name, r in results.items() if r["status"] == "fail"}
    assert code == 1 and failed == SINK_CASES
    assert "MISMATCH" in results["sliding_sinks"]["detail"]


def test_bad_kits(cli, kit, tmp_path):
    code, _, err = cli("conformance", "run", str(tmp_path), "--adapter",
                       "swajax.conformance.adapter:SwajaxAdapter")  # fmt: skip
    assert code == 2 and "is not a conformance kit" in err
    code, _, err = cli("conformance", "export", str(kit))
    assert code == 2 and "not empty" in err
