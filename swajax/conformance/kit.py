"""Export the golden cases to a folder, and run an adapter through them.

DIR/manifest.json            kit version, and every case: name, kind, path, tolerance
DIR/ops/NAME.jsonl           operation sequences with expected results (`protocol.py`)
DIR/ops.schema.json          their JSON schema
DIR/attention/NAME.npz       paged attention cases (`attention_cases.py`)
DIR/logits/NAME/             a checkpoint (config.json, *.safetensors), case.json (prompt,
                             tolerance) and expected.npy ([len(prompt), vocab], float32)
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np

from swajax.conformance import boundary
from swajax.conformance.protocol import OPS_SCHEMA
from swajax.prefix_cache.policy import DEFAULT as DEFAULT_POLICY, policy_of

KIT_VERSION = 4  # 3: frees answer `mapped` in hybrid mode; 4: request inserts carry a branch point
# Operation cases: (preset, workload, page size, requests, full-pool tokens, ratio, seed[, k]).
# The budgets oversubscribe the pools (LRU eviction with a choice of leaves, retraction,
# tombstones and their revival); windows 7 and 8 against page sizes 1, 4 and 16 put the window's
# end inside a page and on a page boundary, where off-by-ones show; k > 0: speculative rounds of
# k draft tokens (emulated acceptance), whose rejected pages go back mid-page. What the cases
# catch is measured with planted bugs (benchmarks/README.md, "The kit's mutation score").
OPS = (
    ("tiny-hybrid", "multi-turn", 1, 12, 1_400, 0.3, 1),
    ("tiny-hybrid", "shared-prefix", 4, 32, 1_200, 0.3, 5),
    ("tiny-mimo", "multi-turn", 4, 12, 1_500, 0.3, 2),
    ("tiny-mimo", "shared-prefix", 16, 24, 1_280, 0.3, 3),
    ("tiny-all-swa", "multi-turn", 1, 8, 1_400, 1.0, 4),
    ("tiny-hybrid", "multi-turn", 4, 8, 1_400, 0.3, 6, 3),
)
SPECULATIVE_ACCEPTANCE = 0.6
# Every operation case of a full export: the recorded workloads and the boundary scripts.
NUM_OPS_CASES = len(OPS) + len(boundary.SCRIPTS)
DRAIN_EVERY = 50  # steps between evict-everything lines, whose free counts must be exact
DEMO_PROMPT = b'def sliding_window(tokens, size):\n    """Return the last size tokens."""\n    '
ATTENTION_RTOL = 1e-5
LOGITS_RTOL = 1e-4


def _record(
    folder: Path,
    policy: str,
    preset: str,
    workload: str,
    ps: int,
    n: int,
    tokens: int,
    ratio: float,
    seed: int,
    speculative: int = 0,
):
    from swajax import sizing
    from swajax.presets import load_preset
    from swajax.serving.options import EngineOptions
    from swajax.simulator.run import run_workload
    from swajax.simulator.workloads import make_workload
    from swajax.trace.recorder import Tracer

    cfg = load_preset(preset)
    sizes = sizing.solve_pool_sizes(cfg, tokens, ratio=ratio, page_size=ps)
    tracers = []
    options = EngineOptions(
        max_running=16,
        max_context=33_792,
        chunk_size=64,
        cache_policy=policy,
        num_speculative_tokens=speculative,
    )
    run_workload(
        cfg,
        sizes,
        make_workload(workload, n, seed),
        options=options,
        progress=False,
        on_engine=lambda e: tracers.append(Tracer(e, drain_every=DRAIN_EVERY)),
        acceptance=SPECULATIVE_ACCEPTANCE,
    )
    tracers[0].finish()
    name = f"{preset}_{workload}_ps{ps}" + (f"_spec{speculative}" if speculative else "")
    tracers[0].write(folder / "ops" / f"{name}.jsonl", plain=True)
    return dict(name=name, kind="ops", path=f"ops/{name}.jsonl")


def export(
    folder: str | Path,
    *,
    models: tuple[str | Path, ...] = (),
    cache_policy: str = DEFAULT_POLICY,
    ops=OPS,
    parts=("ops", "attention", "logits"),
) -> dict:
    """Write the kit. `models`: checkpoint folders in the fixtures' form (config.json,
    safetensors, greedy.json with the prompt, logits.npy from transformers) to include as
    logits cases besides the demo model (whose expected logits swajax computes here).
    `cache_policy`: the profile the operation cases are recorded under (its rules are what a
    backend is certified against). `ops` / `parts`: a subset (tests)."""
    from swajax.conformance.adapter import SwajaxAdapter
    from swajax.conformance.attention_cases import CASES, make_case
    from swajax.demo import DEMO_DIR

    policy_of(cache_policy)  # a clear error for an unknown profile, before any work
    folder = Path(folder)
    for sub in ("ops", "attention", "logits"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    cases = [_record(folder, cache_policy, *spec) for spec in ops] if "ops" in parts else []
    if "ops" in parts and ops is OPS:  # the hand-written boundary cases (boundary.py)
        for name, script in boundary.scripts(cache_policy).items():
            script.write(folder / "ops" / f"{name}.jsonl")
            cases.append(dict(name=name, kind="ops", path=f"ops/{name}.jsonl"))
    for seed, spec in enumerate(CASES if "attention" in parts else ()):
        np.savez(folder / "attention" / f"{spec[0]}.npz", **make_case(spec, seed))
        cases.append(
            dict(
                name=spec[0],
                kind="attention",
                path=f"attention/{spec[0]}.npz",
                tolerance=ATTENTION_RTOL,
            )
        )
    logits = [("demo", Path(DEMO_DIR), list(DEMO_PROMPT), None)] if "logits" in parts else []
    for model in map(Path, models):
        prompt = json.loads((model / "greedy.json").read_text())["prompt"]
        logits.append((model.name, model, prompt, np.load(model / "logits.npy")))
    for name, source, prompt, expected in logits:
        dst = folder / "logits" / name
        dst.mkdir(exist_ok=True)
        for f in [source / "config.json", *source.glob("*.safetensors")]:
            shutil.copy(f, dst / f.name)
        if expected is None:
            expected = SwajaxAdapter().logits(str(dst), prompt)
        np.save(dst / "expected.npy", np.asarray(expected, np.float32))
        (dst / "case.json").write_text(json.dumps(dict(prompt=prompt, tolerance=LOGITS_RTOL)))
        cases.append(
            dict(name=f"logits_{name}", kind="logits", path=f"logits/{name}", tolerance=LOGITS_RTOL)
        )
    if "ops" in parts:
        (folder / "ops.schema.json").write_text(json.dumps(OPS_SCHEMA, indent=1) + "\n")
    manifest = dict(kit_version=KIT_VERSION, cache_policy=cache_policy, cases=cases)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


@dataclasses.dataclass(frozen=True)
class CaseResult:
    name: str
    kind: str
    status: str  # ok | fail | skipped
    detail: str = ""


def _run_case(folder: Path, case: dict, adapter) -> CaseResult:
    from swajax.conformance.oracle import compare
    from swajax.trace.replay import replay

    name, kind, path = case["name"], case["kind"], folder / case["path"]
    if kind == "ops":
        result = replay(path, backend=adapter.allocator_and_cache)
        if result["ok"]:
            return CaseResult(name, kind, "ok", f"{result['ops']} operations")
        detail = result.get("reason") or f"expected {result['expected']}, got {result['actual']}"
        where = f"operation {result['op_number']} ({result['op']}) [{', '.join(result['fields'])}]"
        return CaseResult(name, kind, "fail", f"{where}: {detail}")
    if kind == "attention":
        arrays = dict(np.load(path))
        expected = arrays.pop("expected")
        report = compare(adapter.attention(arrays), expected, rtol=case["tolerance"])
        return CaseResult(name, kind, "ok" if report.ok else "fail", str(report))
    if kind == "logits":
        spec = json.loads((path / "case.json").read_text())
        got = np.asarray(adapter.logits(str(path), spec["prompt"]), np.float64)
        report = compare(got, np.load(path / "expected.npy"), rtol=case["tolerance"])
        return CaseResult(name, kind, "ok" if report.ok else "fail", str(report))
    return CaseResult(name, kind, "fail", f"unknown case kind {kind!r}")


def run(folder: str | Path, adapter) -> list[CaseResult]:
    """Every case of the kit through `adapter`; a method that raises NotImplementedError skips
    its cases, any other exception fails the case with its message."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{folder} is not a conformance kit: {e}") from e
    if manifest.get("kit_version") != KIT_VERSION:
        raise ValueError(
            f"kit version {manifest.get('kit_version')!r}; this swajax runs version {KIT_VERSION}"
        )
    results = []
    for case in manifest["cases"]:
        try:
            results.append(_run_case(folder, case, adapter))
        except NotImplementedError as e:
            results.append(CaseResult(case["name"], case["kind"], "skipped", str(e)))
        except Exception as e:  # noqa: BLE001 - a backend's crash is that case's failure
            results.append(
                CaseResult(case["name"], case["kind"], "fail", f"{type(e).__name__}: {e}")
            )
    return results
