"""Every benchmark script imports on a clean checkout (one once failed on a moved helper)."""

import importlib.util
import pathlib

import pytest

BENCHMARKS = sorted((pathlib.Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.stem)
def test_benchmark_imports(path):
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # runs nothing: each runs under `__main__` only
    assert callable(getattr(module, "main", None))
