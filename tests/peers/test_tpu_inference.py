"""The conformance kit on a peer's kernel: tpu-inference 0.32.0's ragged paged attention (v3,
vLLM's TPU kernel) through `examples/tpu_inference_adapter.py`, and compiled by the TPU
compiler beside swajax's decode kernel (`benchmarks/peer_kernel_tpu.py`).

Not part of the default run (marker `tpu_inference`): it needs the peer's environment, built by
`bash tests/peers/setup_tpu_inference.sh` (or named by SWAJAX_TPU_INFERENCE_PYTHON). Then:

    .venv/bin/python -m pytest -m tpu_inference tests/peers

What it establishes (benchmarks/README.md, "A peer's kernel"):
- the peer's dense reference, with the kit's window W mapped to its `sliding_window` W + 1,
  agrees with the kit's oracle on every window case once the rows no one may read hold finite
  values; with those rows NaN (as exported) it reads freed pages below the window, and each
  such case reduces to one decode query;
- the Pallas kernel does not run in Pallas's TPU interpret mode (JAX 0.11.2, as pinned): the
  interpreter's DMAs take indexed refs only and the kernel DMAs from reshaped and bitcast ones;
- both kernels compile for a v6e at published decode shapes, and swajax's program copies no
  pool (its temporary memory stays under a MiB).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tpu_inference
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_ENV = ROOT / ".venvs" / "tpu-inference"
PEER_PYTHON = Path(os.environ.get("SWAJAX_TPU_INFERENCE_PYTHON", DEFAULT_ENV / "bin" / "python"))
INTERPRETER_LIMIT = ("Transform' object has no attribute 'indices'",)
# The suite's XLA flags and libtpu path are swajax's JAX's: the peer's JAX refuses some of the
# flags, and must load the libtpu of its own environment (another one's Mosaic cannot read it).
PEER_ENV = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "TPU_LIBRARY_PATH")}


@pytest.fixture(scope="module")
def kit(tmp_path_factory) -> Path:
    if not PEER_PYTHON.exists():
        pytest.skip(
            f"no tpu-inference environment at {PEER_PYTHON}: bash {HERE}/setup_tpu_inference.sh"
        )
    from swajax.conformance import kit as kit_lib

    folder = tmp_path_factory.mktemp("kit")
    kit_lib.export(folder, parts=("attention",))
    return folder


def _run(kit: Path, *flags) -> dict[str, dict]:
    run = subprocess.run(
        [str(PEER_PYTHON), str(ROOT / "examples" / "tpu_inference_adapter.py"), str(kit), *flags],
        capture_output=True,
        text=True,
        timeout=1800,
        env=PEER_ENV,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    return {row["case"]: row for row in rows}


def _window_cases(kit: Path) -> list[str]:
    import numpy as np

    manifest = json.loads((kit / "manifest.json").read_text())
    return [
        c["name"] for c in manifest["cases"] if str(np.load(kit / c["path"])["kind"]) == "sliding"
    ]


def test_the_peer_reference_agrees_on_every_window_case(kit):
    rows = _run(kit, "--run", "reference", "--poison", "finite")
    assert rows["chunked_extend"]["status"] == "skipped"
    assert "chunked" in rows["chunked_extend"]["detail"]
    others = {name: row for name, row in rows.items() if name != "chunked_extend"}
    assert others and all(row["status"] == "ok" for row in others.values()), others


def test_the_peer_reference_reads_freed_pages_below_the_window(kit):
    """With the rows no backend may read poisoned, every window case whose batch has freed
    pages fails, and reduces to a single decode query; full attention is unaffected."""
    rows = _run(kit, "--run", "reference", "--poison", "nan", "--reduce")
    window = set(_window_cases(kit))
    assert window
    for name in window:
        smallest = rows[name]["smallest"]
        assert rows[name]["status"] == "fail", rows[name]
        assert len(smallest["seq_lens"]) == 1, smallest
        assert smallest["seq_lens"][0] - smallest["prefix_lens"][0] == 1, smallest
        assert smallest["prefix_lens"][0] > smallest["window"], smallest  # a page slid out
    assert rows["full_decode"]["status"] == rows["full_extend"]["status"] == "ok"


def test_the_kernel_runs_or_names_the_interpreter_limit(kit):
    """The kernel in TPU interpret mode: each case agrees, or fails on the interpreter's
    missing support for reshaped / bitcast refs in DMAs (then nothing is claimed for it), or
    is refused by the kernel's own shape rules; never a wrong answer."""
    rows = _run(kit, "--run", "kernel", "--poison", "finite")
    for row in rows.values():
        if row["status"] in ("ok", "skipped"):
            continue
        assert any(limit in row["detail"] for limit in INTERPRETER_LIMIT) or (
            "ValueError" in row["detail"] and "MISMATCH" not in row["detail"]
        ), row


def test_both_kernels_compile_for_a_v6e(kit):
    """benchmarks/peer_kernel_tpu.py: every published decode shape compiles on both sides;
    swajax's program reads the pools as they lie (no copy in its temporary memory)."""
    rows = []
    for python, side, env in (
        (sys.executable, "swajax", os.environ),
        (str(PEER_PYTHON), "tpu-inference", PEER_ENV),
    ):
        run = subprocess.run(
            [python, str(ROOT / "benchmarks" / "peer_kernel_tpu.py"), "--side", side],
            capture_output=True,
            text=True,
            env=dict(env, ALLOW_MULTIPLE_LIBTPU_LOAD="1"),
            timeout=1200,
        )
        rows += [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    assert len(rows) == 6 and all(r["compiled"] for r in rows), rows
    for row in rows:
        if row["side"] == "swajax":
            assert row["temp_bytes"] < 2**20, row
