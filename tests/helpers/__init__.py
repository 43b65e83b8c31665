"""Shared test helpers: paths, the tolerance table, and plain-Python models of swajax parts."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"  # tiny transformers checkpoints (tools/make_fixtures.py)
FAMILIES = ["gpt_oss", "mimo_v2_flash", "llama4", "gemma3", "qwen3", "mistral"]

# Relative error allowed against transformers' float32 logits, by the dtype swajax computes in.
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 5e-3}


def rel_err(a, b) -> float:
    import numpy as np

    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
