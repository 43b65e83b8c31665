"""What the scheduler's helpers see of it (host code).

Taking a step's result (`results.py`, `speculation.py`), forcing progress (`progress.py`),
planning ahead (`overlap.py`) and the tail rebuild (`tail_rebuild.py`) are parts of the one
`Scheduler`, kept in files of their own so `scheduler.py` is about choosing a batch. They reach
the scheduler only through this Protocol (a test checks every `sched.X` they use is declared
here), as the prefix cache's helpers reach the tree through `prefix_cache.protocol.Tree`: its
queues and counters, its cache and ledger, and the request lifecycle (admit, fit, finish,
retract, abort, window eviction), which stays the scheduler's own.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from swajax.prefix_cache.protocol import PrefixCache
    from swajax.serving.batch import Batch
    from swajax.serving.budget import Budget
    from swajax.serving.ledger import PoolLedger
    from swajax.serving.options import EngineOptions, SchedulerConfig
    from swajax.serving.request import Request


class SchedulerView(Protocol):
    cfg: SchedulerConfig
    options: EngineOptions
    cache: PrefixCache
    ledger: PoolLedger
    waiting: deque[Request]
    running: list[Request]
    separate_swa: bool
    accepted_tokens: int  # draft tokens kept by speculative rounds
    dropped_tokens: int  # overlap: tokens of requests that ended while a step ran

    # The request lifecycle
    def admit(self, req: Request, budget: Budget) -> int: ...
    def start(self, req: Request) -> None: ...
    def fit(self, batch: Batch) -> Batch: ...
    def finish(self, req: Request, reason: str) -> None: ...
    def retract(self, req: Request, *, suspect: bool = False) -> None: ...
    def abort(self, req: Request, reason: str = "aborted") -> None: ...

    # Runtime SWA eviction
    def evict_windows(self, batch: Batch, *, due: bool = False) -> None: ...
    def evict_request_window(self, req: Request) -> None: ...
    def free_window(self, req: Request, start: int, end: int) -> None: ...
