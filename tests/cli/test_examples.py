"""The examples run, and the oracle module catches what it should."""

import importlib.util

import numpy as np
import pytest
from helpers import ROOT

from swajax.conformance.oracle import compare, reference_attention

EXAMPLES = ROOT / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_backend_example_agrees():
    assert load("compare_backend").main().ok


def test_generate_checkpoint_example_hits_the_prefix_cache():
    first, second, summary = load("generate_checkpoint").main()
    assert len(first) == len(second) == 8 and summary["prefix_hit_tokens"] > 0


def test_plan_pools_example():
    rows = load("plan_pools").main()
    fulls = [r[1] for r in rows]
    assert fulls == sorted(fulls)  # a smaller ratio leaves more for the full pool


def test_oracle_reports_the_worst_element():
    expected = np.zeros((2, 3))
    actual = expected.copy()
    actual[1, 2] = 0.5
    report = compare(actual, expected + 1.0)
    assert not report.ok and report.max_abs == 1.0 and report.worst_index == (0, 0)
    report = compare(actual, expected, rtol=1e-3)
    assert report.worst_index == (1, 2) and not report.ok and "MISMATCH" in str(report)
    with pytest.raises(ValueError, match="shapes differ"):
        compare(actual, expected[:1])


def test_oracle_sink_and_window():
    """One query, three keys, window 1: only the last two keys; a sink shrinks the weights."""
    k = np.zeros((2, 2, 1, 1))
    v = np.arange(4, dtype=float).reshape(2, 2, 1, 1)
    q = np.ones((1, 1, 1))
    args = (q, k, v, np.array([[0, 1]]), np.array([3]), np.array([0]), np.array([2]))
    plain = reference_attention(*args, kind="sliding", window=1, scale=1.0)
    assert plain[0, 0, 0] == pytest.approx((1 + 2) / 2)  # keys at positions 1 and 2
    sunk = reference_attention(*args, kind="sliding", window=1, scale=1.0, sinks=np.array([0.0]))
    assert sunk[0, 0, 0] == pytest.approx((1 + 2) / 3)
