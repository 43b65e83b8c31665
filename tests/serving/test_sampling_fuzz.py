"""Fuzzed sampling fields beside a valid request, through the real step program: every fuzzed
request is refused with a `RequestError` or served (finished, or aborted with a reason); the
valid one always completes with the tokens it gets alone; nothing leaks."""

import pytest
from helpers.engine_checks import check_clean
from hypothesis import HealthCheck, given, settings, strategies as st

from swajax.api import EngineSpec, load_model, make_engine
from swajax.errors import RequestError
from swajax.serving.request import Status
from swajax.serving.sampling_params import SamplingParams

VALID_PROMPT = [5, 17, 99, 3, 42, 64, 8, 120]
VALID = SamplingParams(temperature=0.0, max_tokens=6)

# Values at and beyond every limit the step's int32 / float32 / uint32 packing has.
EDGES_INT = [-1, 0, 1, 2, 255, 256, 2**31 - 1, 2**31, 2**32, 2**63, 10**12, -(2**31)]
EDGES_FLOAT = [
    0.0,
    -0.0,
    1e-45,
    0.5,
    1.0,
    2.0,
    1e4,
    3.4e38,
    1e39,
    -1e39,
    float("inf"),
    float("nan"),
    -2.0,
]
WRONG = [None, True, "1", [1], b"1"]


def values(kind):
    if kind == "int":
        base = st.one_of(st.sampled_from(EDGES_INT), st.integers(-5, 300))
    else:
        base = st.one_of(st.sampled_from(EDGES_FLOAT), st.floats(-3, 3, allow_nan=False))
    return st.one_of(base, base, st.sampled_from(WRONG))


FIELDS = {
    "max_tokens": "int",
    "top_k": "int",
    "n": "int",
    "logprobs": "int",
    "seed": "int",
    "temperature": "float",
    "top_p": "float",
    "min_p": "float",
    "repetition_penalty": "float",
    "presence_penalty": "float",
    "frequency_penalty": "float",
}
fuzzed = st.fixed_dictionaries(
    {},
    optional={
        **{name: values(kind) for name, kind in FIELDS.items()},
        "stop_token_ids": st.lists(st.sampled_from(EDGES_INT + [True]), max_size=3),
    },
)


@pytest.fixture(scope="module")
def engine():
    decoder, _ = load_model("tiny", "float32", False)
    spec = EngineSpec.of(max_context=64, kv_budget_gib=0.01, page_size=4, max_running=4)
    engine = make_engine(decoder, spec)
    rid = engine.add_request(VALID_PROMPT, VALID)
    engine.run()
    engine.alone = engine.requests[rid].output
    return engine


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(fields=fuzzed, prompt=st.lists(st.integers(0, 255), min_size=1, max_size=12))
def test_a_fuzzed_request_never_hurts_a_valid_one(engine, fields, prompt):
    try:
        params = SamplingParams(**fields)
        fuzz = engine.add_request(prompt, params)
    except RequestError:
        fuzz = None
    valid = engine.add_request(VALID_PROMPT, VALID)
    engine.run()
    assert engine.requests[valid].output == engine.alone
    if fuzz is not None:
        req = engine.requests[fuzz]
        assert req.status in (Status.FINISHED, Status.ABORTED) and req.finish_reason
    check_clean(engine)
