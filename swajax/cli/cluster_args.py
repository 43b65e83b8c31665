"""The flags that join a command to other processes (`swajax.cluster`): every process runs the
same command with the same inputs, each with its own `--process-id`."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from swajax.cli import args as args_lib
from swajax.cluster import Cluster


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "multiple processes",
        "run the same command in every process (JAX's multi-controller runtime); the model "
        "splits over every device of every process; only process 0 prints results",
    )
    g.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="process 0's address, reachable from every process",
    )
    g.add_argument(
        "--num-processes",
        type=args_lib.int_at_least(1, 1 << 16),
        help="how many processes join (with --coordinator)",
    )
    g.add_argument(
        "--process-id",
        type=args_lib.int_at_least(0, (1 << 16) - 1),
        help="this process's place, 0 .. N-1 (0 hosts the coordinator)",
    )
    g.add_argument(
        "--distributed",
        action="store_true",
        help="join with JAX's own detection of the cluster (SLURM, Open MPI, "
        "Kubernetes, Cloud TPU; JAX_COORDINATOR_ADDRESS) instead of the "
        "flags",
    )
    g.add_argument(
        "--join-timeout",
        type=args_lib.int_at_least(1, 3600),
        default=120,
        help="seconds to reach the coordinator and for all processes to arrive",
    )
    g.add_argument(
        "--heartbeat-timeout",
        type=args_lib.int_at_least(2, 3600),
        default=30,
        help="seconds of silence after which a process is declared dead and every "
        "other one stops with an error",
    )


def cluster_of(args: argparse.Namespace) -> Cluster:
    return Cluster(
        coordinator=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
        auto=args.distributed,
        timeout_s=args.join_timeout,
        heartbeat_s=args.heartbeat_timeout,
    )


# The flags that name what a command reads (outputs, which may differ between hosts before a
# run, are left out).
INPUT_FLAGS = ("--model", "--draft-model", "--prompts-file")


def join_inputs(argv: list[str]) -> dict:
    """What must be equal in every joined process: the command line without `--process-id`,
    and a digest of each file it names (for a folder: its config.json and its files' names and
    sizes), so that two processes given different prompts or checkpoints are told apart."""
    kept, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token == "--process-id":
            skip = True
        elif not token.startswith("--process-id="):
            kept.append(token)
    files = {}
    named = [b for a, b in zip(kept, kept[1:]) if a in INPUT_FLAGS]
    named += [t.split("=", 1)[1] for t in kept if t.split("=", 1)[0] in INPUT_FLAGS and "=" in t]
    for token in named:
        path = Path(token)
        if path.is_file():
            files[token] = _sha256(path)
        elif path.is_dir():
            listing = sorted((p.name, p.stat().st_size) for p in path.iterdir() if p.is_file())
            digest = hashlib.sha256(json.dumps(listing).encode())
            if (path / "config.json").is_file():
                digest.update(_sha256(path / "config.json").encode())
            files[token] = digest.hexdigest()
    return {"argv": kept, "files": files}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
