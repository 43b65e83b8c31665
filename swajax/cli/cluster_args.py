"""The flags that join a command to other processes (`swajax.cluster`): every process runs the
same command with the same inputs, each with its own `--process-id`."""

from __future__ import annotations

import argparse

from swajax.cli import args as args_lib
from swajax.cluster import Cluster


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "multiple processes",
        "run the same command in every process (JAX's multi-controller runtime); the model "
        "splits over every device of every process; only process 0 prints results",
    )
    g.add_argument("--coordinator", metavar="HOST:PORT",
                   help="process 0's address, reachable from every process")  # fmt: skip
    g.add_argument("--num-processes", type=args_lib.int_at_least(1, 1 << 16),
                   help="how many processes join (with --coordinator)")  # fmt: skip
    g.add_argument("--process-id", type=args_lib.int_at_least(0, (1 << 16) - 1),
                   help="this process's place, 0 .. N-1 (0 hosts the coordinator)")  # fmt: skip
    g.add_argument("--distributed", action="store_true",
                   help="join with JAX's own detection of the cluster (SLURM, Open MPI, "
                   "Kubernetes, Cloud TPU; JAX_COORDINATOR_ADDRESS) instead of the "
                   "flags")  # fmt: skip
    g.add_argument("--join-timeout", type=args_lib.int_at_least(1, 3600), default=120,
                   help="seconds to reach the coordinator and for all processes to "
                   "arrive")  # fmt: skip
    g.add_argument("--heartbeat-timeout", type=args_lib.int_at_least(2, 3600), default=30,
                   help="seconds of silence after which a process is declared dead and every "
                   "other one stops with an error")  # fmt: skip


def cluster_of(args: argparse.Namespace) -> Cluster:
    return Cluster(
        coordinator=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
        auto=args.distributed,
        timeout_s=args.join_timeout,
        heartbeat_s=args.heartbeat_timeout,
    )
