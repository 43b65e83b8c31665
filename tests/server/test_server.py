"""`swajax serve` as a real process on 127.0.0.1, driven by real clients: the official `openai`
package (completions and chat, streamed or not) gets exactly the tokens and logprobs the Python
API gives; 32 concurrent streams, some cut off mid-way, leave the pools free; bad requests get
400s naming the field; /metrics parses with Prometheus' own parser.

The server and its model are `conftest.py`'s.
"""

import asyncio
import json
import time

import numpy as np
import pytest
from helpers.server import LLM_SETTINGS, http
from prometheus_client.parser import text_string_to_metric_families

import swajax
from swajax.prefix_cache import explain

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def llm(model):
    return swajax.LLM(str(model), **LLM_SETTINGS)


def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)


PROMPTS = ["def fibonacci(n):", "import numpy as np\n"]


def test_completions_equal_the_python_api(server, llm):
    results = llm.generate(
        PROMPTS, swajax.SamplingParams(temperature=0.0, max_tokens=12, logprobs=2)
    )
    expected = [r.outputs[0] for r in results]
    got = client(server).completions.create(
        model="demo", prompt=PROMPTS, max_tokens=12, temperature=0, logprobs=2
    )
    assert [c.text for c in got.choices] == [e.text for e in expected]
    for c, e in zip(got.choices, expected):
        np.testing.assert_allclose(c.logprobs.token_logprobs, e.token_logprobs, atol=1e-5)
        assert c.finish_reason == "length"
    assert got.usage.completion_tokens == 24
    stream = client(server).completions.create(
        model="demo", prompt=PROMPTS[0], max_tokens=12, temperature=0, logprobs=1, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == expected[0].text
    lps = [lp for c in chunks for lp in c.choices[0].logprobs.token_logprobs]
    np.testing.assert_allclose(lps, expected[0].token_logprobs, atol=1e-5)


def test_sampling_options_reach_the_engine(server, llm):
    params = dict(temperature=0.9, top_p=0.9, seed=4, stop=["\n\n"], presence_penalty=0.5)
    (expected,) = llm.generate(PROMPTS[0], swajax.SamplingParams(max_tokens=40, **params))[
        0
    ].outputs
    got = client(server).completions.create(
        model="demo",
        prompt=PROMPTS[0],
        max_tokens=40,
        **params,
        extra_body=dict(top_k=40, min_p=0.0, repetition_penalty=1.0),
    )
    assert got.choices[0].text == expected.text
    assert got.choices[0].finish_reason == expected.finish_reason


def test_echo_gives_the_prompt_logprobs(server, llm):
    prompt = list(b"def add(a, b):\n    return")
    got = client(server).completions.create(
        model="demo", prompt=prompt, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    lps = got.choices[0].logprobs.token_logprobs
    assert len(lps) == len(prompt) and lps[0] is None
    from swajax.api.generation import teacher_forced_logits

    logits = teacher_forced_logits(llm.engine, prompt).astype(np.float64)
    logits -= logits.max(-1, keepdims=True)
    ref = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(lps[1:], ref[np.arange(len(prompt) - 1), prompt[1:]], atol=1e-5)


def test_chat_uses_the_template(server, model):
    chat_llm = swajax.LLM(str(model), **LLM_SETTINGS)
    (expected,) = chat_llm.chat(
        [{"role": "user", "content": "write a loop"}],
        swajax.SamplingParams(temperature=0.0, max_tokens=10),
    )[0].outputs
    got = client(server).chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "write a loop"}],
        max_tokens=10,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    assert got.choices[0].message.content == expected.text
    np.testing.assert_allclose(
        [t.logprob for t in got.choices[0].logprobs.content], expected.token_logprobs, atol=1e-5
    )
    stream = client(server).chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "write a loop"}],
        max_tokens=10,
        temperature=0,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream) == expected.text


def metrics(base) -> dict[str, float]:
    text = http(f"{base}/metrics")[1]
    families = text_string_to_metric_families(text)
    # a labelled family without series (accepted tokens by position, without a draft) is left out
    return {f.name.removeprefix("swajax:"): f.samples[0].value for f in families if f.samples}


def test_concurrent_streams_and_disconnects_leave_the_pools_free(server):
    async def one(i):
        async with openai.AsyncOpenAI(
            base_url=f"{server}/v1", api_key="none", max_retries=0
        ) as api:
            stream = await api.completions.create(
                model="demo",
                prompt=f"# task {i}\ndef f",
                max_tokens=40,
                temperature=0.7,
                seed=i,
                stream=True,
            )
            text = ""
            async for chunk in stream:
                text += chunk.choices[0].text
                if i % 4 == 0 and len(text) >= 3:  # every fourth client hangs up mid-stream
                    await stream.close()
                    return None
            return chunk.choices[0].finish_reason

    async def all_of_them():
        return await asyncio.gather(*(one(i) for i in range(32)))

    reasons = asyncio.run(all_of_them())
    assert [r for i, r in enumerate(reasons) if i % 4] == ["length"] * 24
    deadline = time.time() + 30
    while time.time() < deadline:
        m = metrics(server)
        if m["num_requests_running"] == 0 and m["num_requests_waiting"] == 0:
            break
        time.sleep(0.2)
    assert m["num_requests_running"] == 0 and m["full_cached_locked_tokens"] == 0
    # Everything not free is the prefix cache's, unlocked: nothing leaked, nothing held.
    assert m["full_pool_free_tokens"] + m["full_cached_evictable_tokens"] == (m["full_pool_tokens"])


@pytest.mark.parametrize(
    "body, field",
    [
        ({"prompt": "x", "temperature": -1}, "temperature"),
        ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
        ({"prompt": "x", "best_of_everything": 3}, "best_of_everything"),
        ({"max_tokens": 3}, "prompt"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        # no coercion: true is not 1, and NaN is said to be what it is
        ({"prompt": "x", "max_tokens": True}, "max_tokens: Input should be a valid integer"),
        ({"prompt": "x", "n": True}, "n: Input should be a valid integer"),
        ({"prompt": "x", "seed": True}, "seed: Input should be a valid integer"),
        ({"prompt": "x", "temperature": True}, "temperature: Input should be a valid number"),
        ({"prompt": "x", "n": 65}, "n: Input should be less than or equal to 64"),
    ],
)
def test_bad_requests_get_400_naming_the_field(server, body, field):
    status, text = http(f"{server}/v1/completions", body)
    assert status == 400 and field in json.loads(text)["error"]["message"]


def test_nan_and_infinity_are_named(server):
    for value in (b"NaN", b"Infinity", b"-Infinity"):
        raw = b'{"prompt": "x", "temperature": ' + value + b"}"
        status, text = http(f"{server}/v1/completions", raw=raw)
        message = json.loads(text)["error"]["message"]
        assert status == 400 and message == "temperature: Input should be a finite number"


def test_more_ids_than_any_request_can_use_are_refused_unparsed(server):
    status, text = http(f"{server}/v1/completions", {"prompt": [7] * 40_000, "max_tokens": 1})
    message = json.loads(text)["error"]["message"]
    assert status == 400 and "holds over 36,864 values" in message  # 64 x 512 + 4,096
    status, text = http(f"{server}/v1/completions", {"prompt": [7] * 600, "max_tokens": 1})
    assert status == 400 and "context limit 512" in json.loads(text)["error"]["message"]


def test_tokenize_answers_no_more_than_the_context(server):
    status, text = http(f"{server}/tokenize", {"prompt": "x" * 2000})
    message = json.loads(text)["error"]["message"]
    assert status == 400 and "2000 tokens, over the context limit 512" in message


def test_malformed_json_and_limits_are_400(server):
    assert http(f"{server}/v1/completions", raw=b"{not json")[0] == 400
    status, text = http(f"{server}/v1/completions", {"prompt": "x" * 600, "max_tokens": 4})
    assert status == 400 and "context limit 512" in json.loads(text)["error"]["message"]
    status, text = http(f"{server}/v1/chat/completions", {"messages": []})
    assert status == 400 and "messages" in json.loads(text)["error"]["message"]


def test_models_health_and_metrics(server):
    assert json.loads(http(f"{server}/health")[1]) == {"status": "ok"}
    assert json.loads(http(f"{server}/v1/models")[1])["data"][0]["id"] == "demo"
    m = metrics(server)
    assert m["full_pool_tokens"] > 0 and "prefix_cache_hits" in m
    assert m["host_full_tokens"] > 0 and "host_loaded_full_tokens" in m


def test_usage_in_every_response_and_at_the_end_of_streams(server):
    api = client(server)
    for stream in (
        api.completions.create(
            model="demo",
            prompt="def f(x):",
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        ),
        api.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        ),
    ):
        chunks = list(stream)
        *body, last = chunks
        assert last.choices == [] and last.usage.completion_tokens == 5
        assert last.usage.total_tokens == last.usage.prompt_tokens + 5 > 5
        assert all(c.usage is None for c in body)
    got = api.completions.create(model="demo", prompt="def f(x):", max_tokens=3, temperature=0)
    assert got.usage.completion_tokens == 3


def test_tokenize_detokenize_version_and_the_model_name(server):
    status, text = http(f"{server}/tokenize", {"prompt": "def f():"})
    body = json.loads(text)
    assert status == 200 and body["count"] == len(body["tokens"]) == 8
    assert body["max_model_len"] == 512
    status, text = http(f"{server}/detokenize", {"tokens": body["tokens"]})
    assert status == 200 and json.loads(text)["prompt"] == "def f():"
    status, text = http(f"{server}/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and json.loads(text)["count"] == len("<|user|>hi\n<|assistant|>")
    assert json.loads(http(f"{server}/version")[1])["version"] == swajax.__version__
    status, text = http(f"{server}/v1/completions", {"model": "gpt-4", "prompt": "x"})
    assert status == 404 and "'gpt-4' does not exist" in json.loads(text)["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        client(server).completions.create(model="other", prompt="x", max_tokens=1)


def test_every_metric_parses_histograms_included(server):
    from swajax.server.metrics import EVENTS, PREFIX, STATE

    client(server).completions.create(model="demo", prompt="def f", max_tokens=4)
    families = {f.name: f for f in text_string_to_metric_families(http(f"{server}/metrics")[1])}
    assert {PREFIX + n for n in {**STATE, **EVENTS}} <= set(families)
    missed = {
        s.labels["reason"]: s.value for s in families[PREFIX + "prefix_cache_missed_tokens"].samples
    }
    assert set(missed) == set(explain.REASONS) and sum(missed.values()) > 0
    for name, kind in EVENTS.items():
        family = families[PREFIX + name]
        assert family.type == kind and all(
            s.labels.get("model_name") == "demo" for s in family.samples
        )
    ttft = families[PREFIX + "time_to_first_token_seconds"]
    count = next(s.value for s in ttft.samples if s.name.endswith("_count"))
    buckets = [s for s in ttft.samples if s.name.endswith("_bucket")]
    assert count >= 1 and buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == count
    usage = families[PREFIX + "kv_cache_usage_perc"].samples[0].value
    assert 0.0 <= usage <= 1.0
