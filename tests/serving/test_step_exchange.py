"""The step's shape: one upload and one read per step, req_to_token writes that do not grow
with the context, a host mirror of the free counts that the device confirms every step."""

import subprocess
import sys

import jax
import numpy as np
import pytest

from swajax.demo import demo_decoder
from swajax.models import HybridLM
from swajax.serving.batch import StepResult
from swajax.serving.ledger import LedgerMismatch
from swajax.serving.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tiny_model():
    return HybridLM(demo_decoder())


@pytest.mark.parametrize("decode_steps", [1, 8])  # plain steps (overlapped), rounds
def test_steady_decode_step_makes_one_upload_and_one_read(
    tiny_engine, tiny_model, monkeypatch, decode_steps
):
    engine = tiny_engine(full=1024, model=tiny_model, chunk=None, decode_steps=decode_steps)
    for prompt in ([5, 6, 7, 8, 9], [1, 2, 3]):
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=120))
    for _ in range(6):  # prefill, then decode steps until every program is compiled
        engine.step()
    calls = {"put": 0, "get": 0}
    put, get = jax.device_put, jax.device_get

    def counted_put(*args, **kwargs):
        calls["put"] += 1
        return put(*args, **kwargs)

    def counted_get(*args, **kwargs):
        calls["get"] += 1
        return get(*args, **kwargs)

    monkeypatch.setattr(jax, "device_put", counted_put)
    monkeypatch.setattr(jax, "device_get", counted_get)
    steps = 5
    with jax.transfer_guard("disallow"):  # any implicit transfer raises
        for _ in range(steps):
            m = engine.step()
            assert m.kind == "decode" and m.new_tokens == 2 * decode_steps
    assert calls == {"put": steps, "get": steps}


def test_req_to_token_writes_do_not_grow_with_context(tiny_engine, tiny_model):
    """Decode steps write one slot per request and position (a round's N) whatever the
    context; the device table holds exactly each request's host slots (admission prefixes and
    chunk re-points included)."""
    engine = tiny_engine(full=2048, ps=4, chunk=16, model=tiny_model, eviction_interval=8)
    system = list(range(100, 140))
    engine.add_request(system + [1] * 40, SamplingParams(temperature=0.0, max_tokens=12))
    engine.run(max_steps=8)
    engine.add_request(
        system + [2, 3], SamplingParams(temperature=0.0, max_tokens=12)
    )  # a prefix hit
    engine.add_request([7] * 5, SamplingParams(temperature=0.0, max_tokens=40))
    runner = engine.runner
    while not engine.idle:
        m = engine.step()
        running = engine.scheduler.running
        if m.kind == "decode":
            assert m.r2t_tokens_written == m.new_tokens
        table = np.asarray(runner.r2t.table)
        for req in running:
            np.testing.assert_array_equal(table[req.row, : req.kv_len], req.slots)
    decodes = [m for m in engine.metrics if m.kind == "decode"]
    assert max(m.r2t_tokens_written for m in decodes) <= 3 * engine.scheduler.cfg.decode_steps
    assert any(m.new_tokens > m.batch_size for m in decodes)  # rounds ran
    assert engine.scheduler.hit_tokens >= 40


def test_the_device_confirms_the_host_mirror(tiny_engine):
    engine = tiny_engine()
    engine.add_request([1, 2, 3, 4, 5], SamplingParams(temperature=0.0, max_tokens=3))
    plan = engine.scheduler.schedule()
    result = engine.runner.run(plan)
    wrong = StepResult(
        result.status,
        result.slots,
        result.free_full - 4,
        result.free_swa,
        result.tokens,
        result.logprobs,
    )
    with pytest.raises(LedgerMismatch, match="host mirror"):
        engine.scheduler.postprocess(plan, wrong)


def test_host_layers_import_no_jax():
    code = (
        "import sys\n"
        "import swajax.serving.engine, swajax.serving.scheduler, swajax.serving.ledger\n"
        "import swajax.prefix_cache\n"
        "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if 'jax' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
