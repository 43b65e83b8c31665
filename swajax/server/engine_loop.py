"""One thread drives the engine; HTTP handlers on the event loop submit jobs and read events.

The engine is not thread-safe and need not be: only `EngineLoop`'s thread touches it. A handler
`submit`s a job (one request's prompts, n samples each) and awaits its asyncio queue; the loop
thread adds the job's requests between steps (so they join the running batch: continuous
batching through the scheduler), steps the engine, matches stop strings, and hands each job the
tokens its samples gained. `cancel` (a client that went away) aborts a job's requests and their
KV goes back. A bounded queue refuses work past `max_waiting` (HTTP 429), and `shutdown` aborts
whatever is in flight and flushes the engine, so nothing stays held.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time

from swajax.api.sample_stream import SampleStream, add_samples, prompt_logprobs
from swajax.serving.sampling_params import SamplingParams

LOG = logging.getLogger(__name__)
# At shutdown, how long the step in progress may still run (every client was answered already).
STEP_BOUND_SECONDS = 10.0


class QueueFull(RuntimeError):
    """More jobs wait than the server takes (HTTP 429)."""


class ShuttingDown(RuntimeError):
    """The server stops: no new work (HTTP 503)."""


class TooLarge(ValueError):
    """One request's sequences (prompts x n) exceed what the queue takes at all (HTTP 400)."""


@dataclasses.dataclass(eq=False)
class Job:
    """One HTTP request's work: its prompts (token ids), their sampling, and where its events go.

    Messages on `queue`: ("accepted",) or ("error", exception) first; then ("tokens", sample,
    [TokenEvent]) as steps finish; then ("done", [(sample, finish reason, prompt logprobs or
    None)]) once every sample has ended."""

    prompts: list[list[int]]
    params: SamplingParams
    keep_logits: bool  # echo: the prompt's logprobs need every prompt position's logits
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = dataclasses.field(default_factory=asyncio.Queue)
    samples: list[SampleStream] = dataclasses.field(default_factory=list)
    accepted: bool = False  # its samples are queued in the engine ("accepted" was sent)
    ended: bool = False  # its last message was sent ("done" or a refusal)
    created: float = dataclasses.field(default_factory=time.perf_counter)
    # Per sample: when its last token was handed out (the metrics' time between tokens), when
    # the step that first scheduled it began, and when its first token was handed out.
    last_token_at: dict = dataclasses.field(default_factory=dict)
    started_at: dict = dataclasses.field(default_factory=dict)
    first_token_at: dict = dataclasses.field(default_factory=dict)

    @property
    def size(self) -> int:
        """The engine requests it queues: n (or best_of) samples of each prompt."""
        return len(self.prompts) * self.params.samples

    def put(self, *message) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, message)


class EngineLoop:
    def __init__(self, llm, *, max_waiting: int = 256):
        self.llm, self.engine, self.max_waiting = llm, llm.engine, max_waiting
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._new: list[Job] = []
        self._cancelled: list[Job] = []
        self._active: list[Job] = []
        self._jobs: set[Job] = set()  # submitted and not answered yet (under the lock)
        self._stopping = False
        self.step_seconds = 0.0  # the last step's wall time (metrics)
        self.step_started = time.perf_counter()  # when the step in progress (or the last) began
        self.aborted_at_shutdown = 0
        self.steps = 0
        self.observer = None  # request timings go here (server/metrics.py), if set
        self._thread = threading.Thread(target=self._run, name="swajax-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> Job:
        """Queue a job (called on the event loop); raises QueueFull or ShuttingDown."""
        size = job.size
        if size > self.max_waiting:
            raise TooLarge(
                f"{len(job.prompts)} prompt(s) x n = {job.params.n} is {size} sequences; one "
                f"request may queue at most {self.max_waiting} (--max-waiting)"
            )
        with self._lock:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            waiting = len(self.engine.scheduler.waiting) + sum(j.size for j in self._new)
            if waiting + size > self.max_waiting:
                raise QueueFull(
                    f"{waiting} sequences wait and this request adds {size}; the limit is "
                    f"{self.max_waiting} (--max-waiting); retry later"
                )
            self._new.append(job)
            self._jobs.add(job)
        self._wake.set()
        return job

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def alive(self) -> bool:
        """The engine thread still runs (a step, or serving)."""
        return self._thread.is_alive()

    def cancel(self, job: Job) -> None:
        """Abort a job's requests (its client went away); their KV goes back."""
        with self._lock:
            self._cancelled.append(job)
        self._wake.set()

    def abort_all(self, reason: str = "abort: server shutting down") -> None:
        """Stop now (thread-safe; a signal handler calls it): new work is refused and every
        job in flight is answered at once, without waiting for the step the engine is in (a
        compile may take a minute): a started one ends with `reason` (streamed as its last
        event), one not started yet is refused as the server stops. The engine thread aborts
        their requests, and their KV goes back, when its step ends."""
        with self._lock:
            self._stopping = True
            jobs, self._jobs = self._jobs, set()
            for job in jobs:
                job.ended = True
                if job.accepted:
                    job.put("done", [(x, reason, None) for x in job.samples])
                else:
                    job.put("error", ShuttingDown("the server is shutting down"))
        self._wake.set()

    def shutdown(self, timeout: float = STEP_BOUND_SECONDS) -> int | None:
        """Refuse new work, answer everything in flight (`abort_all`), and wait at most
        `timeout` seconds for the engine thread to end its step, abort the requests and flush;
        returns how many jobs it aborted, or None if its step outlived the bound (the process
        may then exit without it: the thread is a daemon)."""
        self.abort_all()
        self._thread.join(timeout)
        return None if self._thread.is_alive() else self.aborted_at_shutdown

    # ------------------------------------------------------------------------------------------
    # The loop thread

    def _run(self) -> None:
        while True:
            with self._lock:
                new, self._new = self._new, []
                cancelled, self._cancelled = self._cancelled, []
                stopping = self._stopping
            for job in new:
                self._start(job)
            for job in cancelled:
                self._end(job, "abort: client disconnected")
            if stopping:
                self.aborted_at_shutdown = len(self._active)
                for job in list(self._active):
                    self._end(job, "abort: server shutting down")
                self.engine.flush()
                return
            self._publish()
            if not self._active:
                self.engine.flush()  # releases still queued reach the device
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            start = self.step_started = time.perf_counter()
            try:
                self.engine.step()
            except Exception as error:  # noqa: BLE001 - a bug in the engine: fail, keep serving
                LOG.exception("engine step failed")
                for job in list(self._active):
                    self._end(job, f"abort: error: {type(error).__name__}: {error}")
            self.step_seconds = time.perf_counter() - start
            self.steps += 1

    def _start(self, job: Job) -> None:
        tokenizer = self.llm.tokenizer
        try:
            for index, prompt in enumerate(job.prompts):
                job.samples += add_samples(
                    self.engine, prompt, job.params, index, tokenizer, keep_logits=job.keep_logits
                )
        except Exception as error:  # noqa: BLE001 - bad input: the client's 400
            for x in job.samples:
                self.engine.abort(x.rid)
            with self._lock:
                if not job.ended:
                    job.ended = True
                    self._jobs.discard(job)
                    job.put("error", error)
            return
        with self._lock:
            if job.ended:  # answered by abort_all meanwhile
                for x in job.samples:
                    self.engine.abort(x.rid, "abort: server shutting down")
                return
            job.accepted = True
            job.put("accepted")
        self._active.append(job)
        if self.observer is not None:
            self.observer.admitted(sum(len(p) for p in job.prompts) * job.params.n)

    def _end(self, job: Job, reason: str) -> None:
        for x in job.samples:
            self.engine.abort(x.rid, reason)  # an ended one is left as it is
        self._publish_job(job)

    def _publish(self) -> None:
        for job in list(self._active):
            for x in job.samples:
                req = self.engine.requests[x.rid]
                if not req.done and x.stopped(req):
                    self.engine.stop(x.rid, keep=x.watch.cut[0])
            self._publish_job(job)

    def _publish_job(self, job: Job) -> None:
        if job.ended:
            if job in self._active:  # answered by abort_all
                self._active.remove(job)
            return
        decode = self.llm.tokenizer.decode
        now = time.perf_counter()
        for x in job.samples:
            req = self.engine.requests[x.rid]
            if x not in job.started_at and (req.kv_len or req.output):  # scheduled this step
                job.started_at[x] = self.step_started
            events = x.new_events(req, decode)
            if events:
                self._observe_tokens(job, x, len(events), now)
                job.put("tokens", x, events)
        if all(self.engine.requests[x.rid].done for x in job.samples):
            if job in self._active:
                self._active.remove(job)
            with self._lock:
                if job.ended:
                    return
                job.ended = True
                self._jobs.discard(job)
            top = job.params.logprobs
            ends = []
            for x in job.samples:
                req = self.engine.requests[x.rid]
                prompt = prompt_logprobs(req, top) if job.keep_logits else None
                x.cached_tokens = req.cached_tokens
                ends.append((x, req.finish_reason, prompt))
                if self.observer is not None:
                    self.observer.finished(now - job.created, req.finish_reason or "")
                    self.observer.phases(
                        queued=job.started_at.get(x, now) - job.created,
                        prefill=job.first_token_at.get(x, now) - job.started_at.get(x, now),
                        decode=now - job.first_token_at.get(x, now),
                        prompt_tokens=len(req.prompt),
                        generation_tokens=len(x.tokens(req)),
                    )
            job.put("done", ends)

    def _observe_tokens(self, job: Job, x, count: int, now: float) -> None:
        """First token: time since submission; later ones: the time since the last hand-out,
        shared by the tokens it brought (a multi-step round brings several)."""
        if self.observer is None:
            return
        last = job.last_token_at.get(x)
        if last is None:
            job.first_token_at[x] = now
            self.observer.first_token(now - job.created)
            self.observer.tokens(1, None)
            if count > 1:
                self.observer.tokens(count - 1, 0.0)
        else:
            self.observer.tokens(count, (now - last) / count)
        job.last_token_at[x] = now
