"""Every benchmark runs on a clean checkout: each is imported, and run with `--smoke` (a tiny
setting of the same code path) in process. One once failed on a moved helper; speed itself is
measured by running them, never here. The smoke runs that compile several engines or start
processes (4-70 s each on 2 cores; what they run, the engine and attention tests run too) are
marked slow: `pytest -m slow tests/test_benchmarks.py`."""

import importlib.util
import pathlib

import pytest

BENCHMARKS = sorted((pathlib.Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))
SLOW = {
    "attention",
    "cache_policy",
    "capacity",
    "deterministic",
    "end_to_end",
    "snapshot",
    "floor",
    "kv_dtype",
    "loading",
    "mtp",
    "multihost",
    "overlap",
    "published_shapes",
    "scan_layers",
    "server",
    "server_health",
    "soak",
    "speculative",
    "startup",
}


def load(path):
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # runs nothing: each runs under `__main__` only
    return module


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.stem)
def test_benchmark_imports(path):
    assert callable(load(path).main)


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW else p for p in BENCHMARKS],
    ids=lambda p: p.stem,
)
def test_benchmark_runs(path, capsys):
    module = load(path)
    assert module.main(["--smoke"]) in (None, 0)
    assert capsys.readouterr().out.strip()  # it printed its results
