"""The library's own entry points validate like the command line: a bad value is one
`InputError` (a `ValueError`) naming the argument and the limit, and the engine goes on serving
what it already holds."""

import numpy as np
import pytest

from swajax import sizing
from swajax.api import engine_for
from swajax.errors import InputError
from swajax.presets import load_preset
from swajax.serving.null_model import NullModel
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams

CFG = load_preset("tiny-hybrid")


@pytest.fixture
def engine():
    sizes = sizing.size_hybrid(CFG, 2 << 20, ratio=0.5, page_size=4, dtype="bf16")
    return engine_for(CFG, NullModel(), sizes, EngineOptions(chunk_size=16, max_context=512))


BAD_PROMPTS = [
    (["x"], r"prompt\[0\] = 'x' is not a token id"),
    (None, "must be a sequence of token ids, got NoneType"),
    ("hello", "must be a sequence of token ids, got str"),
    (7, "must be a sequence of token ids, got int"),
    ([1.7], r"prompt\[0\] = 1.7 is not a token id"),
    ([1, True], r"prompt\[1\] = True is not a token id"),
    ([3, -1], r"prompt\[1\] = -1 is not a token id"),
    ([], "the prompt is empty"),
    ([1] * 600, "exceeds the context limit 512 .max_model_len, --context-length."),
]


@pytest.mark.parametrize("prompt, match", BAD_PROMPTS)
def test_a_bad_prompt_is_named_and_the_engine_goes_on(engine, prompt, match):
    good = engine.add_request([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=3))
    with pytest.raises(InputError, match=match):
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=3))
    engine.run()
    assert engine.requests[good].finish_reason == "length"
    assert len(engine.requests) == 1


def test_numpy_token_ids_are_token_ids(engine):
    rid = engine.add_request(
        np.array([1, 2, 3], np.int64), SamplingParams(temperature=0.0, max_tokens=2)
    )
    assert engine.requests[rid].prompt == [1, 2, 3]


BAD_PARAMS = [
    (dict(max_tokens=0), r"max_tokens must be an integer in \[1, 2\*\*31\), got 0"),
    (dict(max_tokens=2.5), r"max_tokens must be an integer in \[1, 2\*\*31\), got 2.5"),
    (dict(temperature="hot"), r"temperature must be a finite number \(float32: .*\), got 'hot'"),
    (dict(temperature=float("nan")), "temperature must be a finite number"),
    (dict(temperature=-0.5), "temperature must be >= 0, got -0.5"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p="1"), "top_p must be a finite number"),
    (dict(top_k=-2), r"top_k must be an integer in \[0, 2\*\*31\), got -2"),
    (dict(min_p=1.5), r"min_p must be in \[0, 1\], got 1.5"),
    (dict(repetition_penalty=0.0), r"repetition_penalty must be > 0 \(1: off\), got 0.0"),
    (dict(presence_penalty=float("inf")), "presence_penalty must be a finite number"),
    (dict(n=0), r"n must be an integer in \[1, 2\*\*31\), got 0"),
    (dict(logprobs=-1), r"logprobs must be an integer in \[0, 2\*\*31\), got -1"),
    (dict(stop=[""]), "stop strings must be non-empty strings, got ''"),
    (dict(stop=5), "stop must be a string or strings, got 5"),
    (dict(seed=-1), r"seed must be an integer in \[0, 2\*\*32\)"),
    (dict(stop_token_ids=5), "stop_token_ids must be token ids, got 5"),
    (dict(stop_token_ids=[1.5]), r"stop_token_ids must be integers in \[0, 2\*\*31\), got 1.5"),
    (dict(stop_token_ids=[-2]), r"stop_token_ids must be integers in \[0, 2\*\*31\), got -2"),
]


@pytest.mark.parametrize("kwargs, match", BAD_PARAMS)
def test_bad_sampling_params_are_named(kwargs, match):
    with pytest.raises(InputError, match=match):
        SamplingParams(**kwargs)


def test_stop_token_ids_may_be_any_sequence():
    assert SamplingParams(temperature=0.0, stop_token_ids=[np.int32(4), 2]).stop_token_ids == (4, 2)


BAD_OPTIONS = [
    (dict(num_speculative_tokens=2.5), "num_speculative_tokens must be an integer >= 0, got 2.5"),
    (dict(num_speculative_tokens=-1), "num_speculative_tokens must be an integer >= 0, got -1"),
    (dict(max_running=0), "max_running must be an integer >= 1, got 0"),
    (dict(max_context="4096"), "max_context must be an integer >= 1 or None, got '4096'"),
    (dict(chunk_size=0), "chunk_size must be an integer >= 1 or None, got 0"),
    (dict(eviction_interval=True), "eviction_interval must be an integer >= 1, got True"),
    (dict(prefix_cache="yes"), "prefix_cache must be True or False, got 'yes'"),
    (dict(cache_policy="fast"), "cache policy must be one of"),
]


@pytest.mark.parametrize("kwargs, match", BAD_OPTIONS)
def test_bad_engine_options_are_named(kwargs, match):
    with pytest.raises(InputError, match=match):
        EngineOptions(**kwargs)


def test_abort_of_an_unknown_id_is_named(engine):
    rid = engine.add_request([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=4))
    for bad in (rid + 1, "0", None):
        with pytest.raises(InputError, match=f"no request has the id {bad!r}"):
            engine.abort(bad)
    engine.abort(rid)
    engine.run()
    assert engine.requests[rid].finish_reason.startswith("abort")


def test_params_must_be_sampling_params(engine):
    with pytest.raises(InputError, match="params must be a SamplingParams, got dict"):
        engine.add_request([1, 2], {"max_tokens": 3})


def test_a_budget_beyond_int32_slots_is_named():
    sizes = sizing.size_hybrid(CFG, sizing.gib_to_bytes(1e6), ratio=0.5, page_size=16, dtype="bf16")
    with pytest.raises(InputError, match="more than int32 slot ids address"):
        engine_for(CFG, NullModel(), sizes)
