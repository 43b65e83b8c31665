"""The host runner gives back what a step took when the model raises after the allocation, so
the host allocator keeps matching the ledger and the engine goes on serving."""

from helpers.engine_checks import allocator_state, check_clean

from swajax.memory import allocator as A
from swajax.serving.null_model import NullModel
from swajax.serving.sampling_params import SamplingParams


class FailsOnce(NullModel):
    """Raises on its `fail_at`-th forward (a step that has already allocated)."""

    def __init__(self, fail_at: int):
        super().__init__()
        self.calls, self.fail_at = 0, fail_at

    def forward_and_sample(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("the model failed mid-step")
        return super().forward_and_sample(*args, **kwargs)


def test_a_failed_step_gives_its_pages_back(tiny_engine):
    engine = tiny_engine(model=None)
    engine.model = engine.runner.model = FailsOnce(fail_at=1)  # a prefill: it took fresh pages
    rids = [
        engine.add_request(
            [(3 * i + j) % 50 + 1 for j in range(20)],
            SamplingParams(temperature=0.0, max_tokens=12),
        )
        for i in range(3)
    ]
    engine.run()
    assert any("mid-step" in str(e) for e in engine.errors)
    engine.flush()
    avail = A.available(allocator_state(engine.runner))
    assert (int(avail.full), int(avail.swa)) == engine.ledger.available()
    done = [engine.requests[r] for r in rids]
    assert sum(len(r.output) == 12 for r in done) >= 2  # the others were served in full
    check_clean(engine)
