"""`swajax launch-local`: start N processes of one command on this machine, joined into one
cluster (`swajax.cluster`), the way a cluster launcher would start them on N hosts.

For trying and testing the multi-process engine on one machine: each process gets
`--coordinator 127.0.0.1:PORT --num-processes N --process-id I` and, with `--cpu-devices D`,
D CPU devices of its own. Process 0's output is the command's output; the others' error lines
come prefixed with their id. When a process fails the others are given the heartbeat bound to
stop on their own (JAX's runtime stops them), then terminated; the launcher's status is the
first failure's."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time

from swajax.cli import args as args_lib
from swajax.cli.args import UsageError

JOINED = ("generate", "logits")  # the commands that take the cluster flags


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(cpu_devices: int | None) -> dict[str, str]:
    env = dict(os.environ)
    if cpu_devices:
        flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
        flags.append(f"--xla_force_host_platform_device_count={cpu_devices}")
        env["XLA_FLAGS"] = " ".join(flags)
        env["JAX_PLATFORMS"] = "cpu"
    return env


def _relay(stream, label: str) -> None:
    for line in iter(stream.readline, ""):
        sys.stderr.write(f"[{label}] {line}")
    stream.close()


def run_launch(args) -> int:
    command = args.command_args[1:] if args.command_args[:1] == ["--"] else args.command_args
    if not command or command[0] not in JOINED:
        raise UsageError(f"launch-local runs one of {', '.join(JOINED)}: give it after '--'")
    if any(flag in command for flag in ("--coordinator", "--process-id", "--num-processes")):
        raise UsageError("launch-local sets --coordinator, --num-processes and --process-id")
    n, port = args.num_processes, args.port or _free_port()
    base = [
        sys.executable,
        "-m",
        "swajax",
        *command,
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        str(n),
        "--heartbeat-timeout",
        str(args.heartbeat_timeout),
    ]
    procs, relays = [], []
    for i in range(n):
        p = subprocess.Popen(
            [*base, "--process-id", str(i)],
            env=_env(args.cpu_devices),
            stdout=None if i == 0 else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        t = threading.Thread(target=_relay, args=(p.stderr, f"process {i}"), daemon=True)
        t.start()
        procs.append(p)
        relays.append(t)
    try:
        status = _wait(procs, grace=args.heartbeat_timeout + 10)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for t in relays:
            t.join(timeout=5)
    return status


def _wait(procs, grace: float) -> int:
    """0 when every process succeeds; else the first failure's status, after the others have
    had `grace` seconds to stop on their own."""
    first = None
    deadline = None
    while True:
        codes = [p.poll() for p in procs]
        if first is None:
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                first, deadline = failed[0], time.monotonic() + grace
                i, code = first
                why = f"signal {-code}" if code < 0 else f"status {code}"
                print(
                    f"swajax launch-local: process {i} exited with {why}; waiting up to "
                    f"{grace:.0f} s for the others to stop",
                    file=sys.stderr,
                )
        if all(c is not None for c in codes):
            break
        if deadline is not None and time.monotonic() > deadline:
            print("swajax launch-local: terminating the processes still running", file=sys.stderr)
            break
        time.sleep(0.1)
    if first is None:
        return 0
    code = first[1]
    return code if 0 < code < 256 else 1


def register(sub) -> None:
    p = sub.add_parser("launch-local", help="run a command as N joined processes on this machine")
    p.add_argument(
        "--num-processes",
        type=args_lib.int_at_least(1, 64),
        required=True,
        help="processes to start",
    )
    p.add_argument(
        "--cpu-devices",
        type=args_lib.int_at_least(1, 256),
        metavar="D",
        help="give each process D CPU devices (JAX_PLATFORMS=cpu)",
    )
    p.add_argument(
        "--port",
        type=args_lib.int_at_least(1, 65535),
        help="the coordinator's port (default: a free one)",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=args_lib.int_at_least(2, 3600),
        default=30,
        help="passed to every process (see generate --heartbeat-timeout)",
    )
    p.add_argument(
        "command_args",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="e.g. -- generate --model DIR --prompt-ids 1,2,3",
    )
    p.set_defaults(func=run_launch)
