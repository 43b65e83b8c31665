"""`swajax plan --workload`: choose `swa_full_tokens_ratio` (and the prefill chunk) by modeled
step time, not only by capacity.

Each candidate ratio runs the workload on the null-model engine (`simulate.run_workload`) with
the step-time roofline (`simulator/step_time.py`) as its clock; the best modeled output tokens/s
wins and is compared with one pool and with SGLang's default ratio 0.8. Candidates start at the
corrected minimum ratio: the SWA pool must hold the prefill chunk in flight besides every
running request's window (W), eviction lag (I) and partial page (P):

    r * N_full(r) >= chunk + R * (W + I + P),   R = min(max_running, N_full(r) / T)

with T the workload's mean sequence length; `(W + I + P) / T`, the old estimate, is this
without the chunk.
"""

from __future__ import annotations

import dataclasses

from swajax import sizing
from swajax.config import HybridConfig
from swajax.serving.options import EngineOptions
from swajax.simulator.step_time import StepTimeModel
from swajax.simulator.workloads import Workload

RATIOS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.8, 1.0)
CHUNKS = (2048, 4096, 8192, 16384)
SGLANG_DEFAULT_RATIO = 0.8
MAX_RUNNING = 256


def mean_sequence_length(workload: Workload) -> float:
    """Prompt plus output tokens of the requests that arrive first (follow-up turns are longer
    still, so this errs towards a higher minimum ratio)."""
    lengths = [len(a.prompt) + a.params.max_tokens for a in workload.initial]
    return sum(lengths) / max(len(lengths), 1)


def corrected_min_ratio(
    cfg: HybridConfig,
    budget_bytes: int,
    *,
    mean_len: float,
    chunk: int,
    page_size: int,
    dtype: str = "bf16",
    eviction_interval: int = sizing.DEFAULT_EVICTION_INTERVAL,
    max_running: int = MAX_RUNNING,
) -> float:
    """The least ratio whose SWA pool holds the chunk in flight plus every running request's
    window, by bisection (the SWA side grows with r, the demand shrinks with N_full)."""
    f, s = sizing.token_bytes(cfg, dtype)
    if not s or not f:
        return 1.0
    per_request = sizing.swa_residency(cfg.sliding_window or 0, eviction_interval, page_size)

    def enough(r: float) -> bool:
        n_full = budget_bytes / (f + r * s)
        running = min(max_running, n_full / max(mean_len, 1.0))
        return r * n_full >= chunk + running * per_request

    if not enough(1.0):
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


@dataclasses.dataclass(frozen=True)
class Candidate:
    ratio: float | None  # None: one pool
    chunk: int
    tokens_per_s: float
    ttft_s: float
    itl_s: float
    peak_concurrency: int
    steps: int
    loaded_tokens_per_s: float = 0.0  # up to the last request sent (`run.RunSummary`)


@dataclasses.dataclass(frozen=True)
class Plan:
    best: Candidate
    single: Candidate
    sglang_default: Candidate
    min_ratio: float
    candidates: tuple[Candidate, ...]
    devices: int
    by: str = "tokens_per_s"  # the Candidate field the plan maximised

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _run(
    cfg, budget, workload_factory, timer, *, ratio, chunk, page_size, dtype, host_cache_gib=0.0
) -> Candidate:
    from swajax.simulator.run import run_workload

    if ratio is None:
        sizes = sizing.size_single_pool(cfg, budget, page_size=page_size, dtype=dtype)
    else:
        sizes = sizing.size_hybrid(cfg, budget, ratio=ratio, page_size=page_size, dtype=dtype)
        sizes = sizing.with_host_tier(sizes, cfg, host_cache_gib, dtype)  # (hybrid runs only)
    options = EngineOptions(max_running=MAX_RUNNING, max_context=33_792, chunk_size=chunk)
    run = run_workload(cfg, sizes, workload_factory(), options=options, progress=False, timer=timer)
    # Each candidate's pool sizes compile their own programs, useless to the next one; hundreds
    # of them in one process have crashed XLA's CPU compiler (a long sweep, or the tests).
    import jax

    jax.clear_caches()
    return Candidate(
        ratio,
        chunk,
        run.tokens_per_s,
        run.ttft_s,
        run.itl_s,
        run.peak_concurrency,
        run.steps,
        run.loaded_tokens_per_s,
    )


def plan(
    cfg: HybridConfig,
    budget_bytes: int,
    workload_factory,
    timer: StepTimeModel,
    *,
    chunks: tuple[int, ...] = (8192,),
    ratios: tuple[float, ...] = RATIOS,
    page_size: int = 16,
    dtype: str = "bf16",
    run_fn=None,
    host_cache_gib: float = 0.0,
    loaded: bool = False,
) -> Plan:
    """Sweep ratios at or above the corrected minimum (and `chunks`), pick the best modeled
    throughput: over the whole run, or (`loaded`: a closed-loop workload) up to the last
    request sent, so the drain at the end, the same for every ratio, does not dilute it.
    `workload_factory()` makes a fresh copy of the workload for each run;
    `run_fn(ratio, chunk) -> Candidate` replaces the simulation (tests)."""
    by = "loaded_tokens_per_s" if loaded else "tokens_per_s"
    mean_len = mean_sequence_length(workload_factory())
    min_ratio = max(
        corrected_min_ratio(
            cfg, budget_bytes, mean_len=mean_len, chunk=c, page_size=page_size, dtype=dtype
        )
        for c in chunks
    )
    first = -(-min_ratio * 100 // 1) / 100  # the minimum, rounded up to a hundredth
    grid = sorted({r for r in ratios if r >= min_ratio} | {min(first, 1.0)})
    run = run_fn or (
        lambda ratio, chunk: _run(
            cfg,
            budget_bytes,
            workload_factory,
            timer,
            ratio=ratio,
            chunk=chunk,
            page_size=page_size,
            dtype=dtype,
            host_cache_gib=host_cache_gib,
        )
    )
    candidates = tuple(run(r, c) for c in chunks for r in grid)
    singles = [run(None, c) for c in chunks]
    default_chunk = chunks[len(chunks) // 2] if len(chunks) > 1 else chunks[0]
    return Plan(
        best=max(candidates, key=lambda c: getattr(c, by)),
        single=max(singles, key=lambda c: getattr(c, by)),
        sglang_default=run(SGLANG_DEFAULT_RATIO, default_chunk),
        min_ratio=min_ratio,
        candidates=candidates,
        devices=timer.devices,
        by=by,
    )


def format_plan(p: Plan) -> str:
    loaded = p.by == "loaded_tokens_per_s"
    rows = [
        f"{'ratio':>8}{'chunk':>8}{'tokens/s':>12}"
        + (f"{'loaded':>12}" if loaded else "")
        + f"{'TTFT s':>10}{'ITL ms':>9}{'peak':>7}"
    ]
    for c in p.candidates + (p.single,):
        name = "one pool" if c.ratio is None else f"{c.ratio:g}"
        rows.append(
            f"{name:>8}{c.chunk:>8}{c.tokens_per_s:>12,.0f}"
            + (f"{c.loaded_tokens_per_s:>12,.0f}" if loaded else "")
            + f"{c.ttft_s:>10.2f}{c.itl_s * 1e3:>9.2f}{c.peak_concurrency:>7}"
        )
    b, key = p.best, (lambda c: getattr(c, p.by))
    what = "loaded tokens/s (up to the last request sent)" if loaded else "tokens/s"
    rows += [
        f"corrected minimum ratio {p.min_ratio:.4f}; devices {p.devices}",
        f"planned ratio {b.ratio:g} (chunk {b.chunk}): {key(b):,.0f} {what} = "
        f"{key(b) / max(key(p.single), 1e-9):.2f}x one pool, "
        f"{key(b) / max(key(p.sglang_default), 1e-9):.2f}x ratio 0.8",
    ]
    return "\n".join(rows)


def plot(p: Plan, path: str) -> None:
    """Modeled throughput against the ratio, one line per chunk, one pool dashed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib: pip install -e '.[plot]'") from e
    fig, ax = plt.subplots(figsize=(7, 4))
    for chunk in sorted({c.chunk for c in p.candidates}):
        pts = sorted((c.ratio, getattr(c, p.by)) for c in p.candidates if c.chunk == chunk)
        ax.plot(*zip(*pts), marker="o", label=f"hybrid, chunk {chunk}")
    ax.axhline(getattr(p.single, p.by), linestyle="--", color="gray", label="one pool")
    ax.set_xlabel("swa_full_tokens_ratio")
    ax.set_ylabel("modeled output tokens/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
