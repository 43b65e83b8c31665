"""A steady decode compiles nothing once warmed up: every step of the same kind reuses the
programs of the first ones (buckets, not lengths, decide shapes), with runtime eviction
releasing SWA pages every few steps, at 1, 64 and 256 running requests. The null model runs on
the host runner and compiles nothing at all, from its first step."""

import pytest

from swajax.demo import demo_decoder
from swajax.memory.compilations import compilation_count
from swajax.models import HybridLM
from swajax.serving.sampling_params import SamplingParams


def steady_compilations(engine, running, prompt, warm, tokens, *, from_start=False):
    """Programs compiled while every request decodes `tokens` more tokens after `warm` (counted
    in tokens, not steps: a multi-step round decodes several per step)."""
    start = compilation_count()
    n = engine.scheduler.cfg.decode_steps
    for i in range(running):
        engine.add_request(
            [(7 * i + j) % 200 + 1 for j in range(prompt)],
            SamplingParams(temperature=0.0, max_tokens=warm + tokens + 2 * n),
        )

    def decode_to(length):
        while min(len(r.output) for r in engine.requests.values()) < length:
            engine.step()

    decode_to(warm)
    if not from_start:
        start = compilation_count()
    decode_to(warm + tokens)
    assert len(engine.scheduler.running) == running
    if n > 1:  # the steady steps were rounds
        assert engine.metrics[-1].new_tokens == running * n
    return compilation_count() - start


@pytest.mark.parametrize("running", [1, 64, 256])
def test_null_model_compiles_nothing(tiny_engine, running):
    """Prefill, decode and eviction rounds: not one program (what lets `plan` sweep pool
    sizes without a compile per size)."""
    engine = tiny_engine(
        full=running * 256, ps=16, chunk=4096, max_running=running, eviction_interval=16
    )
    compiled = steady_compilations(engine, running, prompt=32, warm=40, tokens=64, from_start=True)
    assert compiled == 0 and engine.runner.compilations() == 0


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "running, decode_steps",
    [
        (1, 1),
        (1, 8),
        pytest.param(64, 8, marks=SLOW),
        pytest.param(64, 1, marks=SLOW),
        pytest.param(256, 8, marks=SLOW),
    ],
)  # plain steps (with overlap) and rounds (the default); wide batches: the null model's above
def test_model_steady_decode_compiles_nothing(tiny_engine, running, decode_steps):
    """The demo model (W = 64): prompts already past the window, so every eviction round
    releases about as many pages as the next; four rounds in the warm-up."""
    engine = tiny_engine(
        full=running * 192 + 256,
        ps=4,
        chunk=4096,
        max_running=running,
        model=HybridLM(demo_decoder()),
        max_context=200,
        eviction_interval=16,
        decode_steps=decode_steps,
    )
    assert steady_compilations(engine, running, prompt=72, warm=64, tokens=48) == 0
