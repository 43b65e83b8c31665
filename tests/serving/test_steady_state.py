"""A steady decode compiles nothing once warmed up: every step of the same kind reuses the
programs of the first ones (buckets, not lengths, decide shapes), with runtime eviction
releasing SWA pages every few steps, at 1, 64 and 256 running requests. The null model runs on
the host runner and compiles nothing at all, from its first step."""

import pytest

from swajax.demo import demo_decoder
from swajax.memory.compilations import compilation_count
from swajax.models import HybridLM
from swajax.serving.sampling_params import SamplingParams


def steady_compilations(engine, running, prompt, warm_steps, steps, *, from_start=False):
    start = compilation_count()
    for i in range(running):
        engine.add_request([(7 * i + j) % 200 + 1 for j in range(prompt)],
                           SamplingParams(max_new_tokens=warm_steps + steps + 8))  # fmt: skip
    for _ in range(warm_steps):
        engine.step()
    assert all(len(r.output) >= 1 for r in engine.requests.values())  # all decoding
    if not from_start:
        start = compilation_count()
    for _ in range(steps):
        engine.step()
    assert len(engine.scheduler.running) == running
    return compilation_count() - start


@pytest.mark.parametrize("running", [1, 64, 256])
def test_null_model_compiles_nothing(tiny_engine, running):
    """Prefill, decode and eviction rounds: not one program (what lets `plan` sweep pool
    sizes without a compile per size)."""
    engine = tiny_engine(full=running * 256, ps=16, chunk=4096, max_running=running,
                         eviction_interval=16)  # fmt: skip
    compiled = steady_compilations(engine, running, prompt=32, warm_steps=40, steps=64,
                                   from_start=True)  # fmt: skip
    assert compiled == 0 and engine.runner.compilations() == 0


@pytest.mark.parametrize("running", [1, 64, pytest.param(256, marks=pytest.mark.slow)])
def test_model_steady_decode_compiles_nothing(tiny_engine, running):
    """The demo model (W = 64): prompts already past the window, so every eviction round
    releases about as many pages as the next; four rounds in the warm-up."""
    engine = tiny_engine(full=running * 192 + 256, ps=4, chunk=4096, max_running=running,
                         model=HybridLM(demo_decoder()), max_context=200,
                         eviction_interval=16)  # fmt: skip
    assert steady_compilations(engine, running, prompt=72, warm_steps=64, steps=48) == 0
