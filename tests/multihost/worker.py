"""One process of a multi-process test: join the cluster, run `workload.run` over every device
of every process, write the result as JSON (`--out`). `--die-after-join` exits abruptly once
joined (the peer-failure test)."""

from __future__ import annotations

import argparse
import json
import os

from swajax.cluster import Cluster, join


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--coordinator", required=True)
    p.add_argument("--num-processes", type=int, required=True)
    p.add_argument("--process-id", type=int, required=True)
    p.add_argument("--fixture", required=True)
    p.add_argument("--attention", default="xla")
    p.add_argument("--out")
    p.add_argument("--heartbeat", type=int, default=10)
    p.add_argument("--die-after-join", action="store_true")
    p.add_argument("--hybrid-off", action="store_true")
    p.add_argument("--snapshot", help="a folder: run workload.resume instead")
    p.add_argument("--phase", choices=("save", "restore"), default="save")
    a = p.parse_args()
    join(
        Cluster(a.coordinator, a.num_processes, a.process_id, timeout_s=60, heartbeat_s=a.heartbeat)
    )
    print("joined", flush=True)
    if a.die_after_join:
        os._exit(7)  # no shutdown, no goodbye: as a crash would
    from multihost import workload

    if a.snapshot:
        result = workload.resume(a.fixture, None, a.snapshot, a.phase)
    else:
        result = workload.run(a.fixture, None, a.attention, hybrid_memory=not a.hybrid_off)
    with open(a.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
