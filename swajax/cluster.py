"""Joining JAX's multi-controller runtime: one process per host (or per group of devices), all
running the same program over one global mesh.

swajax adds nothing to JAX's own distributed runtime: `jax.distributed.initialize` connects the
processes to a coordinator, after which `jax.devices()` lists every process's devices and a
program over a mesh of them runs on all processes at once (on CPU the collectives go through
gloo). What this module adds is the settings a command line needs, the bounds that make a dead
peer an error instead of a hang, and errors that name the address and the limit.

A process that stops sending heartbeats for `heartbeat_s` is declared dead by the coordinator,
and JAX then terminates every other process with "the JAX distributed service detected fatal
errors ... another task died" (an abort from its runtime, not a Python exception: a process
blocked in a collective cannot be unblocked any other way). `timeout_s` bounds the wait for the
coordinator and for every process to arrive.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import socket
import time

import jax

from swajax.errors import InputError

LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Cluster:
    """How this process joins: an explicit coordinator, process count and id, or `auto` (JAX's
    own detection: SLURM, Open MPI, Kubernetes, Cloud TPU, and JAX_COORDINATOR_ADDRESS with
    the launcher's process variables)."""

    coordinator: str | None = None  # HOST:PORT, reachable from every process
    num_processes: int | None = None
    process_id: int | None = None
    auto: bool = False
    timeout_s: int = 120  # to reach the coordinator and for all processes to arrive
    heartbeat_s: int = 30  # a silent peer is declared dead after this

    @property
    def requested(self) -> bool:
        return self.auto or self.coordinator is not None

    def check(self) -> None:
        given = [self.coordinator, self.num_processes, self.process_id]
        if self.auto:
            if any(v is not None for v in given):
                raise InputError(
                    "--distributed auto takes the coordinator, process count and id from the "
                    "cluster's environment: give those flags or auto, not both"
                )
            return
        if self.coordinator is None:
            if any(v is not None for v in given):
                raise InputError("--num-processes and --process-id need --coordinator HOST:PORT")
            return
        host, _, port = self.coordinator.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InputError(f"--coordinator must be HOST:PORT, got {self.coordinator!r}")
        if self.num_processes is None or self.process_id is None:
            raise InputError("--coordinator needs --num-processes N and --process-id I")
        if self.num_processes < 1:
            raise InputError(f"--num-processes must be >= 1, got {self.num_processes}")
        if not 0 <= self.process_id < self.num_processes:
            raise InputError(
                f"--process-id must be in [0, {self.num_processes}) for --num-processes "
                f"{self.num_processes}, got {self.process_id}"
            )


def join(cluster: Cluster, inputs: dict | None = None) -> None:
    """Connect this process to the others (before anything else touches JAX's devices). A
    coordinator that cannot be reached within `timeout_s` is an error naming it; process 0
    binds only the coordinator's address, and a port in use there is an error at once.
    `inputs`: what must be the same in every process (the command line, digests of the files
    it names); a process given other inputs is refused, every process naming the first
    difference."""
    cluster.check()
    if not cluster.requested:
        return
    # CPU processes exchange their collectives over gloo (ignored by GPU and TPU backends).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    where = cluster.coordinator or "the cluster's coordinator"
    bind = None
    if cluster.coordinator is not None and cluster.process_id == 0:
        _check_free(cluster.coordinator)
        bind = cluster.coordinator  # JAX's default listens on every interface
    elif cluster.coordinator is not None:
        _reach(cluster)
    try:
        jax.distributed.initialize(
            cluster.coordinator,
            cluster.num_processes,
            cluster.process_id,
            initialization_timeout=cluster.timeout_s,
            heartbeat_timeout_seconds=cluster.heartbeat_s,
            coordinator_bind_address=bind,
        )
    except ValueError as e:  # JAX found no cluster in the environment (--distributed)
        raise InputError(f"--distributed: JAX detected no cluster here ({e})") from e
    except Exception as e:  # noqa: BLE001 - JAX raises runtime errors of several types
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        who = "" if cluster.process_id is None else f"process {cluster.process_id}: "
        raise RuntimeError(
            f"{who}could not join {where} within {cluster.timeout_s} s ({first})"
        ) from e
    LOG.info(
        "process %d of %d: %d local device(s) of %d",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    if inputs is not None:
        _agree(inputs, cluster.timeout_s)


def _check_free(coordinator: str) -> None:
    """Process 0 is about to listen on the coordinator's address: a port already taken there
    is named now (JAX's own service reports it only after its start-up times out)."""
    host, _, port = coordinator.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, int(port)))
        except OSError as e:
            why = "the port is in use" if e.errno == errno.EADDRINUSE else e.strerror or str(e)
            raise InputError(
                f"--coordinator {coordinator}: process 0 cannot listen there ({why}); choose "
                "another port or address"
            ) from None


KEY = "swajax/inputs/"


def _agree(inputs: dict, timeout_s: int) -> None:
    """Every process publishes its inputs and reads everyone's; any difference is an error
    in every process, naming the first difference (rather than a later mismatch deep in a
    collective, or a hang)."""
    from jax._src import distributed

    client = distributed.global_state.client
    me, n = jax.process_index(), jax.process_count()
    client.key_value_set(f"{KEY}{me}", json.dumps(inputs, sort_keys=True))
    for other in range(n):
        if other == me:
            continue
        theirs = json.loads(client.blocking_key_value_get(f"{KEY}{other}", timeout_s * 1000))
        difference = first_difference(inputs, theirs)
        if difference is not None:
            raise InputError(
                f"process {me} and process {other} were given different inputs: {difference}; "
                "every process must run the same command (only --process-id differs)"
            )


def first_difference(mine: dict, theirs: dict) -> str | None:
    """The first difference of two processes' inputs, in words (None: the same)."""
    a, b = mine.get("argv", []), theirs.get("argv", [])
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"argument {i + 1} is {x!r} here and {y!r} there"
    if len(a) != len(b):
        extra = a[len(b) :] or b[len(a) :]
        return f"one command line has {len(extra)} more argument(s): {' '.join(extra)!r}"
    for name in sorted(set(mine.get("files", {})) | set(theirs.get("files", {}))):
        x, y = mine.get("files", {}).get(name), theirs.get("files", {}).get(name)
        if x != y:
            return f"{name} holds other contents (sha256 {str(x)[:12]} here, {str(y)[:12]} there)"
    return None


def _reach(cluster: Cluster) -> None:
    """Wait until the coordinator accepts connections, or raise naming it. JAX's client ends
    the process (an abort from its runtime) when its first connection times out, so the wait
    that can fail with a message happens here, before it."""
    host, _, port = cluster.coordinator.rpartition(":")
    deadline = time.monotonic() + cluster.timeout_s
    while True:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
            return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"process {cluster.process_id}: could not join {cluster.coordinator} within "
                    f"{cluster.timeout_s} s ({e.strerror or e}): is process 0 running there?"
                ) from None
            time.sleep(0.2)


def is_leader() -> bool:
    """Whether this process reports results (process 0; the only one when not joined)."""
    return jax.process_index() == 0
