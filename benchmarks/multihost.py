"""Several processes against one: the per-step cost of running the engine as 2 joined processes x
2 CPU devices (gloo collectives) against 1 process x 4 devices, the same model split four ways
(and one unsplit device for scale), and the bytes of weights each process reads at load against
the checkpoint's size / N.

    python benchmarks/multihost.py [--fixture gpt_oss_kv4] [--batch 4] [--steps 64] [--json]

Each configuration runs in fresh subprocesses: two warm-up generations (compiling every program),
then a timed one of `--batch` new prompts x `--steps` new tokens; ms per engine step is its wall
time over the steps it took (`compiled_while_timed` in --json says that nothing compiled). The
joined processes also time the alternative design, one process planning and broadcasting each
step's packed plan to the others (`multihost_utils.broadcast_one_to_all` of a plan-sized int32
buffer): the cost per step that replicated scheduling does not pay.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
PLAN_INTS = 1024  # a decode step's packed upload is a few hundred int32s at these batch sizes


def _env(devices: int) -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["SWAJAX_COMPILE_CACHE"] = "off"
    return env


class _BytesRead(logging.Handler):
    """The loader's one line: (bytes of weights read, bytes of checkpoint files)."""

    found: tuple[int, int] | None = None

    def emit(self, record):
        if record.getMessage().startswith("read ") and len(record.args) == 2:
            self.found = tuple(record.args)


def measure(path: str, batch: int, steps: int) -> dict:
    import jax
    import numpy as np

    from swajax.api import LLM
    from swajax.serving.sampling_params import SamplingParams

    log, seen = logging.getLogger("swajax.models.loading"), _BytesRead()
    log.addHandler(seen)
    log.setLevel(logging.INFO)
    split = None if jax.process_count() > 1 else jax.device_count()
    llm = LLM(
        path,
        max_running_requests=batch,
        max_model_len=steps + 64,
        kv_budget_gib=0.01,
        tensor_parallel_size=split,
    )
    log.removeHandler(seen)
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
    for _ in range(2):  # compile every program (the second run's prefix cache adds one)
        llm.generate([rng.integers(3, 100, 24).tolist() for _ in range(batch)], params)
    before = llm.summary()
    prompts = [rng.integers(3, 100, 24).tolist() for _ in range(batch)]
    start = time.perf_counter()
    llm.generate(prompts, params)
    wall = time.perf_counter() - start
    after = llm.summary()
    taken = after["steps"] - before["steps"]
    out = dict(
        processes=jax.process_count(),
        devices=jax.device_count(),
        ms_per_step=1e3 * wall / taken,
        steps=taken,
        compiled_while_timed=after["compilations"] - before["compilations"],
        weight_bytes_read=seen.found[0],
        checkpoint_bytes=seen.found[1],
    )
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        plan = np.zeros(PLAN_INTS, np.int32)
        multihost_utils.broadcast_one_to_all(plan)
        start = time.perf_counter()
        for _ in range(taken):
            multihost_utils.broadcast_one_to_all(plan)
        out["broadcast_ms_per_step"] = 1e3 * (time.perf_counter() - start) / taken
    return out


def _worker(a) -> None:
    from swajax.cluster import Cluster, join

    if a.coordinator:
        join(Cluster(a.coordinator, a.num_processes, a.process_id, timeout_s=120))
    result = measure(a.path, a.batch, a.steps)
    Path(a.out).write_text(json.dumps(result))


def _run(path: str, batch: int, steps: int, processes: int, devices: int, tmp: Path) -> list:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs, outs = [], []
    for i in range(processes):
        out = tmp / f"{processes}-{i}.json"
        argv = [
            sys.executable,
            __file__,
            "--worker",
            "--path",
            path,
            "--batch",
            str(batch),
            "--steps",
            str(steps),
            "--out",
            str(out),
        ]
        if processes > 1:
            argv += [
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                str(processes),
                "--process-id",
                str(i),
            ]
        procs.append(
            subprocess.Popen(
                argv,
                env=_env(devices),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        outs.append(out)
    for p in procs:
        _, err = p.communicate(timeout=1800)
        if p.returncode:
            raise RuntimeError(f"a worker failed:\n{err[-3000:]}")
    return [json.loads(o.read_text()) for o in outs]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixture", default="gpt_oss_kv4", help="a folder of tests/fixtures")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--smoke", action="store_true", help="a tiny run (the test suite's)")
    p.add_argument("--json", action="store_true")
    for flag in ("--worker",):
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag in ("--path", "--out", "--coordinator"):
        p.add_argument(flag, help=argparse.SUPPRESS)
    for flag in ("--num-processes", "--process-id"):
        p.add_argument(flag, type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return _worker(a)
    if a.smoke:
        a.batch, a.steps = 1, 4
    path = str(FIXTURES / a.fixture)
    with tempfile.TemporaryDirectory() as tmp:
        alone = _run(path, a.batch, a.steps, 1, 1, Path(tmp))[0]
        one = _run(path, a.batch, a.steps, 1, 4, Path(tmp))[0]
        two = _run(path, a.batch, a.steps, 2, 2, Path(tmp))
    result = dict(
        fixture=a.fixture,
        batch=a.batch,
        steps=a.steps,
        one_device=alone,
        one_process=one,
        two_processes=two,
        step_ratio=two[0]["ms_per_step"] / one["ms_per_step"],
        read_vs_share=[w["weight_bytes_read"] / (w["checkpoint_bytes"] / 2) for w in two],
    )
    if a.json:
        print(json.dumps(result))
        return
    print(f"{a.fixture}, batch {a.batch}, {a.steps} new tokens, split over 4 CPU devices")
    print(f"  1 device (no split):     {alone['ms_per_step']:.2f} ms/step")
    print(f"  1 process  x 4 devices: {one['ms_per_step']:.2f} ms/step")
    print(
        f"  2 processes x 2 devices: {two[0]['ms_per_step']:.2f} ms/step "
        f"({result['step_ratio']:.2f}x one process)"
    )
    print(
        f"  broadcasting a {4 * PLAN_INTS}-byte plan each step instead: "
        f"+{two[0]['broadcast_ms_per_step']:.2f} ms/step"
    )
    for i, w in enumerate(two):
        print(
            f"  process {i} read {w['weight_bytes_read']:,} bytes of weights; checkpoint / 2 = "
            f"{w['checkpoint_bytes'] // 2:,} ({result['read_vs_share'][i]:.2f}x)"
        )
    print(
        f"  (one process on 4 devices read {one['weight_bytes_read']:,} of "
        f"{one['checkpoint_bytes']:,})"
    )


if __name__ == "__main__":
    main()
