"""The engine across real processes (JAX's multi-controller runtime on CPU, gloo collectives):
2 processes x 2 CPU devices, the model split over all four. Each process runs the same
scheduler on the same inputs (BUILD_NOTES.md: "Several processes"), so each must produce the
same tokens as one process on four devices and as one device; logprobs agree to float32
reduction order (the all-reduce over gloo sums in another order than in one process)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import FIXTURES, ROOT

from multihost import workload

WORKER = Path(__file__).with_name("worker.py")
PROCESSES, DEVICES = 2, 2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={DEVICES}"])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    return env


def _start(port: int, i: int, *extra: str) -> subprocess.Popen:
    argv = [
        sys.executable,
        str(WORKER),
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        str(PROCESSES),
        "--process-id",
        str(i),
        *extra,
    ]
    return subprocess.Popen(
        argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _joined(procs, tmp_path, fixture: str, attention: str, hybrid: bool) -> list[dict]:
    port = _port()
    outs = [tmp_path / f"process{i}.json" for i in range(PROCESSES)]
    common = ["--fixture", str(FIXTURES / fixture), "--attention", attention]
    common += [] if hybrid else ["--hybrid-off"]
    procs += [_start(port, i, *common, "--out", str(outs[i])) for i in range(PROCESSES)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    return [json.loads(o.read_text()) for o in outs]


@pytest.fixture
def procs():
    """Processes a test started; any still running at its end are killed."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=60)  # reaps it and closes its pipes


def _same(joined: dict, reference: dict, what: str) -> None:
    assert joined["tokens"] == reference["tokens"], what
    for a, b in zip(joined["logprobs"], reference["logprobs"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=what)


# All with -m slow: the default run's multi-process case is launch-local's (two joined processes
# whose greedy tokens are one device's); this is the same promise under a workload with a prefix
# hit, eviction every step, chunked prefill, overlap, an abort and retractions.
@pytest.mark.parametrize(
    "fixture, attention, hybrid",
    [
        pytest.param("gpt_oss_kv4", "xla", True, marks=pytest.mark.slow),  # MoE, sinks
        pytest.param("qwen3_kv4", "xla", True, marks=pytest.mark.slow),
        pytest.param("gpt_oss_kv4", "pallas", True, marks=pytest.mark.slow),  # interpret mode
        pytest.param("gpt_oss_kv4", "xla", False, marks=pytest.mark.slow),  # one pool
    ],
)
def test_two_processes_match_one_process_and_one_device(
    procs, tmp_path, fixture, attention, hybrid
):
    """Tokens and logprobs of 2 processes x 2 devices against 1 device, with a prefix hit,
    eviction every step, chunked prefill, overlap, an abort and retractions; every process ends
    with both pools free (checked inside each worker) and the same results as the others."""
    joined = _joined(procs, tmp_path, fixture, attention, hybrid)
    one = workload.run(str(FIXTURES / fixture), 1, attention, hybrid)
    assert joined[0] == joined[1]  # the processes agree bit for bit
    assert joined[0]["cached"][3] > 0  # the second wave hit the first's prefix
    assert joined[0]["retractions"] > 0 and joined[0]["aborted"].startswith("abort")
    _same(joined[0], one, "2 processes vs 1 device")


@pytest.mark.slow
def test_two_processes_match_one_process_on_four_devices(procs, tmp_path):
    """The same workload split 2 x 2 over processes and 4 ways in one process."""
    joined = _joined(procs, tmp_path, "gpt_oss_kv4", "xla", True)
    four = workload.run(str(FIXTURES / "gpt_oss_kv4"), 4, "xla", True)
    _same(joined[0], four, "2 processes vs 1 process on 4 devices")


@pytest.mark.parametrize("victim", [1, pytest.param(0, marks=pytest.mark.slow)])
def test_a_killed_process_stops_the_other_within_the_bound(procs, victim):
    """SIGKILL one process once both have joined; the survivor (busy loading and compiling, or
    blocked in a collective) ends with an error naming the failure within the heartbeat bound,
    not a hang."""
    heartbeat, port = 4, _port()
    procs += [
        _start(
            port,
            i,
            "--fixture",
            str(FIXTURES / "gpt_oss_kv4"),
            "--out",
            os.devnull,
            "--heartbeat",
            str(heartbeat),
        )
        for i in range(PROCESSES)
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "joined"
    procs[victim].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    survivor = procs[1 - victim]
    _, err = survivor.communicate(timeout=heartbeat + 60)
    took = time.monotonic() - killed
    assert survivor.returncode != 0
    assert took < heartbeat + 30, took
    assert "another task died" in err or "unhealthy" in err or "heartbeat" in err, err[-2000:]


def test_an_unreachable_coordinator_is_an_error_naming_it(cli):
    """Process 1 of 2 with nobody at the coordinator's address: an error line within the join
    timeout, naming the address and the bound."""
    port = _port()
    argv = [
        sys.executable,
        "-m",
        "swajax",
        "generate",
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        "2",
        "--process-id",
        "1",
        "--join-timeout",
        "3",
    ]
    start = time.monotonic()
    done = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"could not join 127.0.0.1:{port} within 3 s" in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - start < 60


def test_launch_local_prints_process_zeros_results(tmp_path):
    """`swajax launch-local -- generate --json`: the command's output once (process 0's), the
    tokens of one process on one device."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt_ids": workload.A}) + "\n")
    model = str(FIXTURES / "qwen3_kv4")
    argv = [
        sys.executable,
        "-m",
        "swajax",
        "launch-local",
        "--num-processes",
        "2",
        "--cpu-devices",
        "2",
        "--",
        "generate",
        "--model",
        model,
        "--prompts-file",
        str(prompts),
        "--max-tokens",
        "5",
        "--json",
        "--ignore-eos",
    ]
    done = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in done.stdout.splitlines()]
    assert len(lines) == 2 and "summary" in lines[1]  # one output, one summary: process 0's
    from swajax.api import LLM
    from swajax.serving.sampling_params import SamplingParams

    one = LLM(
        model,
    ).generate([workload.A], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    assert lines[0]["tokens"] == one[0].outputs[0].token_ids


@pytest.mark.slow
def test_launch_local_logits_are_written_once_and_match_one_device(tmp_path):
    """`swajax logits` joined: process 0 writes the file; the logits are one device's (to the
    all-reduce's summation order)."""
    out = tmp_path / "joined.npy"
    model = str(FIXTURES / "gpt_oss_kv4")
    ids = ",".join(map(str, workload.A))
    argv = [
        sys.executable,
        "-m",
        "swajax",
        "launch-local",
        "--num-processes",
        "2",
        "--cpu-devices",
        "2",
        "--",
        "logits",
        "--model",
        model,
        "--prompt-ids",
        ids,
        "--out",
        str(out),
    ]
    done = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("wrote") == 1
    one = tmp_path / "one.npy"
    single = [
        sys.executable,
        "-m",
        "swajax",
        "logits",
        "--model",
        model,
        "--prompt-ids",
        ids,
        "--out",
        str(one),
    ]
    subprocess.run(single, env=_env(), check=True, capture_output=True, timeout=600)
    np.testing.assert_allclose(np.load(out), np.load(one), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_an_orbax_folder_restores_into_each_processes_shards(tmp_path):
    """`swajax convert` output (orbax) restored with every parameter's global sharding, each
    process reading its own shards: one device's tokens."""
    from swajax.api import LLM
    from swajax.models import load_decoder, save_orbax
    from swajax.serving.sampling_params import SamplingParams

    source = FIXTURES / "qwen3_kv4"
    save_orbax(load_decoder(source), source, tmp_path / "orbax")
    argv = [
        sys.executable,
        "-m",
        "swajax",
        "launch-local",
        "--num-processes",
        "2",
        "--cpu-devices",
        "2",
        "--",
        "generate",
        "--model",
        str(tmp_path / "orbax"),
        "--prompt-ids",
        ",".join(map(str, workload.A)),
        "--max-tokens",
        "5",
        "--json",
        "--ignore-eos",
    ]
    done = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    tokens = json.loads(done.stdout.splitlines()[0])["tokens"]
    one = LLM(
        str(source),
    ).generate([workload.A], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    assert tokens == one[0].outputs[0].token_ids


def _joining(port: int, i: int, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "swajax", "generate", "--coordinator", f"127.0.0.1:{port}"]
    argv += ["--num-processes", "2", "--process-id", str(i), "--join-timeout", "60", *extra]
    pipe = subprocess.PIPE
    return subprocess.Popen(argv, env=_env(), stdout=pipe, stderr=pipe, text=True)


def test_processes_given_different_arguments_are_refused_naming_the_difference(procs):
    port = _port()
    procs += [
        _joining(port, 0, "--max-tokens", "4"),
        _joining(port, 1, "--max-tokens", "5"),
    ]
    start = time.monotonic()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 2, err[-2000:]
        line = err.strip().splitlines()[-1]
        assert "were given different inputs" in line and "'4'" in line and "'5'" in line, line
    assert time.monotonic() - start < 60


def _listeners(port: int) -> list[str]:
    """Local addresses of the TCP sockets listening on `port` (/proc/net/tcp, tcp6)."""
    found = []
    for name in ("tcp", "tcp6"):
        for row in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            addr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                found.append(addr)
    return found


def test_the_coordinator_listens_only_on_its_address_and_a_taken_port_is_named(procs):
    port = _port()
    procs.append(_joining(port, 0))  # waits for a process 1 that never comes
    deadline = time.monotonic() + 60
    while not _listeners(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    # 127.0.0.1 only (as IPv4, or IPv4-mapped IPv6), never 0.0.0.0 or [::]
    loopback = {"0100007F", "0000000000000000FFFF00000100007F"}
    assert _listeners(port) and set(_listeners(port)) <= loopback, _listeners(port)
    start = time.monotonic()
    second = _joining(port, 0)
    _, err = second.communicate(timeout=60)
    assert second.returncode == 2 and time.monotonic() - start < 30
    line = err.strip().splitlines()[-1]
    assert f"--coordinator 127.0.0.1:{port}" in line and "the port is in use" in line, line


def _resume_joined(procs, tmp_path, folder, phase: str) -> list[dict]:
    port = _port()
    outs = [tmp_path / f"{phase}{i}.json" for i in range(PROCESSES)]
    common = ["--fixture", str(FIXTURES / "gpt_oss_kv4"), "--snapshot", str(folder)]
    procs += [
        _start(port, i, *common, "--phase", phase, "--out", str(outs[i])) for i in range(PROCESSES)
    ]
    for p in procs[-PROCESSES:]:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.slow  # (21 s: four processes started, each compiling)
def test_a_snapshot_across_processes_resumes_there_and_in_one_process(procs, tmp_path):
    """Two processes x two devices save a running engine into one folder, each process its
    own shards; two fresh processes restore it and finish the requests bit for bit as the
    saved ones did; one process on four devices restores the same folder (the shards read
    into its own placement) and finishes them with the same tokens."""
    folder = tmp_path / "snap"
    saved = _resume_joined(procs, tmp_path, folder, "save")
    assert saved[0] == saved[1]
    assert (folder / "swajax_state.json").is_file()
    restored = _resume_joined(procs, tmp_path, folder, "restore")
    assert restored[0] == saved[0]  # bit for bit, tokens and logprobs
    one = workload.resume(str(FIXTURES / "gpt_oss_kv4"), 4, str(folder), "restore")
    _same(one, saved[0], "1 process on 4 devices vs the 2 processes that saved")
