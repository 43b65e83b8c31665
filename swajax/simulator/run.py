"""The simulator: the null-model engine on a workload, hybrid pools against one pool.

Both runs get the same KV budget and the same workload in the same process, so their ratio is
a like-for-like measure of what hybrid SWA memory buys.
"""

from __future__ import annotations

import dataclasses

from swajax import progress_bar, sizing
from swajax.api import engine_for
from swajax.config import HybridConfig
from swajax.errors import RequestError
from swajax.serving.engine import Engine
from swajax.serving.null_model import NullModel
from swajax.serving.options import EngineOptions
from swajax.serving.request import Status
from swajax.simulator.step_time import Span, StepTimeModel
from swajax.simulator.workloads import Workload, workload_of


@dataclasses.dataclass(frozen=True)
class RunSummary:
    mode: str
    full_tokens: int
    swa_tokens: int
    steps: int
    requests: int
    finished: int
    rejected: int  # refused at submission with a clear error (too long for the pools)
    lost: int  # accepted requests that never finished (must be 0)
    peak_concurrency: int
    mean_concurrency: float
    tokens_per_step: float
    prefix_hit_rate: float
    swa_tail_miss_tokens: int
    prefill_tokens: int  # computed by extend steps (prompts, recomputed prefixes, rebuilds)
    rebuilt_tokens: int  # recomputed by exact SWA-tail rebuilds
    rebuild_saved_tokens: int  # what the fallback would have recomputed on top of those
    retractions: int
    compilations: int
    full_occupancy: list[float]  # per step
    swa_occupancy: list[float]
    # Modeled by `simulator/step_time.py` when an accelerator is given (else 0): seconds to run
    # the workload, output tokens per second, mean time to first token, mean inter-token gap.
    modeled_seconds: float = 0.0
    tokens_per_s: float = 0.0
    ttft_s: float = 0.0
    itl_s: float = 0.0
    # Output tokens per modeled second until the last request was sent (0 when all arrive at
    # once): throughput at the offered load, before the batch drains (closed-loop workloads).
    loaded_tokens_per_s: float = 0.0
    # A host tier: its (full, SWA) capacity in tokens, and the tokens moved each way in all.
    host_tokens: tuple[int, int] = (0, 0)
    host_saved_tokens: tuple[int, int] = (0, 0)
    host_loaded_tokens: tuple[int, int] = (0, 0)
    first_rejection: str = ""  # the first rejection's error (it names the limit), or ""

    def check_ran(self) -> None:
        """Refuse a run in which every request was rejected: it measured nothing."""
        if self.rejected and not self.requests:
            raise RequestError(
                f"every request ({self.rejected}) was rejected, none ran "
                f"({self.mode.value} pools); the first: {self.first_rejection}"
            )


def run_workload(
    cfg: HybridConfig,
    sizes: sizing.PoolSizes,
    workload: Workload,
    *,
    options: EngineOptions,
    progress: bool,
    on_engine=None,
    timer: StepTimeModel | None = None,
    acceptance: float = 1.0,
    overlap: bool = False,
) -> RunSummary:
    """Run `workload` on the null model. With a `timer`, a modeled clock advances by each
    step's modeled time: arrivals are submitted when the clock reaches them, follow-ups (the
    next chat turn) as soon as their predecessor finishes. `acceptance`: the emulated draft's
    acceptance rate (speculative decoding); `overlap`: emulate overlap scheduling."""
    model = NullModel(acceptance=acceptance, overlap=overlap)
    engine = engine_for(cfg, model, sizes, options)
    if on_engine is not None:
        on_engine(engine)  # e.g. attach a trace recorder
    arrivals, rejected, pending = {}, [], list(workload.initial)
    clock, submitted, token_times, last_sent = 0.0, {}, {}, 0.0

    def submit(arrival):
        nonlocal last_sent
        last_sent = clock
        try:
            rid = engine.add_request(arrival.prompt, arrival.params)
        except RequestError as e:  # e.g. a conversation outgrew the pools: it ends here
            rejected.append(str(e))
            nxt = workload.after_rejection(arrival)
            if nxt is not None:
                nxt.at = clock
                pending.insert(0, nxt)
            return
        arrivals[rid], submitted[rid], token_times[rid] = arrival, clock, []

    finished = set()
    with progress_bar.progress(workload.total, str(sizes.mode.value), shown=progress) as advance:
        while True:
            while pending and (timer is None or pending[0].at <= clock):
                submit(pending.pop(0))
            if engine.idle:
                if not pending:
                    break
                clock = pending[0].at  # nothing to run until the next arrival
                continue
            metrics = engine.step()
            if metrics is None:
                break
            if timer is not None:
                clock += timer.step_seconds(Span(pre, seq) for _, pre, seq, _ in metrics.spans)
                clock += timer.load_seconds(*metrics.host_loaded)
            for rid, _, _, sampled in metrics.spans:
                if sampled:
                    token_times[rid].append(clock)
            for rid, arrival in list(arrivals.items()):
                req = engine.requests[rid]
                if req.status is Status.FINISHED and rid not in finished:
                    finished.add(rid)
                    nxt = workload.follow_up(arrival, req.output)
                    if nxt is not None:
                        nxt.at = clock
                        pending.insert(0, nxt)
                    advance()
    summary = _summary(engine, sizes, arrivals, finished, rejected)
    if timer is None:
        return summary
    return dataclasses.replace(summary, **_latencies(clock, submitted, token_times, last_sent))


def _latencies(clock: float, submitted: dict, token_times: dict, last: float) -> dict:
    firsts = [t[0] - submitted[rid] for rid, t in token_times.items() if t]
    gaps = [b - a for t in token_times.values() for a, b in zip(t, t[1:])]
    tokens = sum(len(t) for t in token_times.values())
    loaded = sum(1 for t in token_times.values() for x in t if x <= last)
    return dict(
        modeled_seconds=clock,
        tokens_per_s=tokens / clock if clock else 0.0,
        ttft_s=sum(firsts) / max(len(firsts), 1),
        itl_s=sum(gaps) / max(len(gaps), 1),
        loaded_tokens_per_s=loaded / last if last else 0.0,
    )


def _summary(engine: Engine, sizes, arrivals, finished, rejected) -> RunSummary:
    steps = engine.metrics
    last = steps[-1] if steps else None
    full_total = max(sizes.full_tokens, 1)
    swa_total = max(sizes.swa_tokens, 1)
    return RunSummary(
        mode=sizes.mode,
        full_tokens=sizes.full_tokens,
        swa_tokens=sizes.swa_tokens,
        steps=len(steps),
        requests=len(arrivals),
        finished=len(finished),
        rejected=len(rejected),
        first_rejection=rejected[0] if rejected else "",
        lost=len(arrivals) - len(finished),
        peak_concurrency=max((m.running for m in steps), default=0),
        mean_concurrency=sum(m.running for m in steps) / max(len(steps), 1),
        tokens_per_step=sum(m.new_tokens for m in steps) / max(len(steps), 1),
        prefix_hit_rate=engine.scheduler.hit_tokens / max(engine.scheduler.admitted_tokens, 1),
        swa_tail_miss_tokens=last.swa_tail_miss_tokens if last else 0,
        prefill_tokens=sum(m.new_tokens for m in steps if m.kind == "extend"),
        rebuilt_tokens=last.rebuilt_tokens if last else 0,
        rebuild_saved_tokens=last.rebuild_saved_tokens if last else 0,
        retractions=last.retractions if last else 0,
        compilations=last.compilations if last else 0,
        full_occupancy=[m.full_used / full_total for m in steps],
        swa_occupancy=[m.swa_used / swa_total for m in steps],
        **_host(engine, sizes),
    )


def _host(engine: Engine, sizes) -> dict:
    tier = getattr(engine.cache, "tier", None)
    if tier is None:
        return {}
    return dict(
        host_tokens=(sizes.host_full_tokens, sizes.host_swa_tokens),
        host_saved_tokens=tuple(tier.saved),
        host_loaded_tokens=tuple(tier.loaded),
    )


def simulate(
    cfg: HybridConfig,
    budget_bytes: int,
    *,
    workload: str,
    requests: int,
    ratio: float,
    clients: int | None = None,
    page_size: int,
    seed: int = 0,
    chunk_size: int = 8192,
    max_running: int = 256,
    dtype: str = "bf16",
    progress: bool = False,
    timer: StepTimeModel | None = None,
    cache_policy: str = "lean",
    tail_rebuild: bool = True,
    draft: HybridConfig | None = None,
    speculative_tokens: int = 0,
    acceptance: float = 1.0,
    host_cache_gib: float = 0.0,
) -> dict:
    """Run the workload with hybrid pools and with one pool; returns both summaries and ratios.
    `workload`: a built-in name (`requests` of them) or a JSON-lines file, sent by `clients`
    clients in a closed loop if given (`workloads.closed_loop`); `timer` adds
    modeled throughput and latencies; `host_cache_gib`: a host tier for the hybrid run's
    prefix cache (one pool has no second lifetime to keep; its run has none)."""
    kw = dict(page_size=page_size, dtype=dtype, draft=draft)
    hybrid = sizing.size_hybrid(cfg, budget_bytes, ratio=ratio, **kw)
    hybrid = sizing.with_host_tier(hybrid, cfg, host_cache_gib, dtype, draft)
    single = sizing.size_single_pool(cfg, budget_bytes, **kw)
    options = EngineOptions(
        max_running=max_running,
        max_context=33_792,
        chunk_size=chunk_size,
        cache_policy=cache_policy,
        tail_rebuild=tail_rebuild,
        num_speculative_tokens=speculative_tokens,
    )
    runs = {
        name: run_workload(
            cfg,
            sizes,
            workload_of(workload, requests, seed, clients=clients),
            options=options,
            progress=progress,
            timer=timer,
            acceptance=acceptance,
        )
        for name, sizes in (("hybrid", hybrid), ("single", single))
    }
    h, s = runs["hybrid"], runs["single"]
    return dict(
        hybrid=h,
        single=s,
        peak_concurrency_ratio=h.peak_concurrency / max(s.peak_concurrency, 1),
        mean_concurrency_ratio=h.mean_concurrency / max(s.mean_concurrency, 1e-9),
        steps_ratio=s.steps / max(h.steps, 1),
        tokens_per_s_ratio=h.tokens_per_s / max(s.tokens_per_s, 1e-9),
        loaded_tokens_per_s_ratio=h.loaded_tokens_per_s / max(s.loaded_tokens_per_s, 1e-9),
    )
