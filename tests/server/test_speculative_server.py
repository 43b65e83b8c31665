"""`swajax serve --speculative-algorithm mtp` over the demo with its own generation_config (a
repetition penalty): the official client's logprobs, top_logprobs, penalties, stop strings, n
and logit_bias all served through MTP rounds, greedy answers equal to plain decoding's, and the
speculative counters in /metrics under vLLM's names."""

import json
import shutil

import numpy as np
import pytest
from helpers.server import LLM_SETTINGS, SETTINGS, demo_folder, http, serve
from prometheus_client.parser import text_string_to_metric_families

import swajax
import swajax.demo

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.xdist_group("speculative-server")

PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = demo_folder(tmp_path_factory.mktemp("m") / "demo")
    src = swajax.demo.__file__.rsplit("/", 1)[0]
    shutil.copy(f"{src}/generation_config.json", path / "generation_config.json")
    return path


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = [*SETTINGS, "--speculative-algorithm", "mtp", "--speculative-num-steps", "2"]
    proc, base = serve(model, args, log)
    yield base
    proc.terminate()
    proc.wait(30)
    assert "stopped; 0 request(s) in flight aborted, 0 running" in log.read_text()


@pytest.fixture(scope="module")
def plain(model):
    return swajax.LLM(str(model), **LLM_SETTINGS)


def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120)


def test_logprobs_and_a_penalty_through_mtp_rounds_equal_plain_decoding(server, plain):
    penalties = dict(frequency_penalty=0.4, presence_penalty=0.2)
    params = swajax.SamplingParams(temperature=0.0, max_tokens=24, logprobs=2, **penalties)
    (want,) = plain.generate(PROMPT, params, use_tqdm=False)[0].outputs
    got = client(server).completions.create(
        model="demo", prompt=PROMPT, max_tokens=24, temperature=0, logprobs=2, **penalties
    )
    (choice,) = got.choices
    assert choice.text == want.text
    np.testing.assert_allclose(choice.logprobs.token_logprobs, want.token_logprobs, atol=1e-4)
    for a, b in zip(choice.logprobs.top_logprobs, want.logprobs, strict=True):
        top = sorted(b.values(), reverse=True)[: len(a)]
        np.testing.assert_allclose(sorted(a.values(), reverse=True), top, atol=1e-4)


def test_chat_top_logprobs_stop_and_n_through_mtp_rounds(server, plain):
    messages = [{"role": "user", "content": "write a loop"}]
    got = client(server).chat.completions.create(
        model="demo",
        messages=messages,
        max_tokens=20,
        temperature=0.8,
        seed=3,
        n=2,
        logprobs=True,
        top_logprobs=3,
        frequency_penalty=0.5,
        stop=["\n\n"],
    )
    assert len(got.choices) == 2
    for c in got.choices:
        assert c.finish_reason in ("stop", "length") and "\n\n" not in c.message.content
        assert c.logprobs.content
        for entry in c.logprobs.content:
            assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
    greedy = dict(max_tokens=16, temperature=0.0, stop=["\n\n"], presence_penalty=0.4)
    answer = client(server).chat.completions.create(model="demo", messages=messages, **greedy)
    (want,) = plain.chat(messages, swajax.SamplingParams(**greedy), use_tqdm=False)[0].outputs
    assert answer.choices[0].message.content == want.text


def test_logit_bias_and_the_token_fields_with_a_draft(server, plain):
    bias = {str(ord("a")): 100}
    got = client(server).completions.create(
        model="demo", prompt=PROMPT, max_tokens=6, temperature=0, logit_bias=bias
    )
    assert got.choices[0].text == "aaaaaa"
    body = dict(model="demo", prompt=PROMPT, max_tokens=10, temperature=0, min_tokens=10)
    body["bad_words"] = ["e"]
    status, text = http(f"{server}/v1/completions", body)
    assert status == 200, text
    out = json.loads(text)["choices"][0]["text"]
    assert "e" not in out and json.loads(text)["usage"]["completion_tokens"] == 10
    params = swajax.SamplingParams(temperature=0, max_tokens=10, min_tokens=10, bad_words=["e"])
    assert out == plain.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].text
    status, text = http(f"{server}/v1/completions", {**body, "suffix": "return"})
    assert status == 400 and "suffix" in text  # the demo has no fill-in-the-middle tokens


def test_the_speculative_counters_are_in_metrics(server):
    client(server).completions.create(model="demo", prompt=PROMPT, max_tokens=12, temperature=0)
    status, text = http(f"{server}/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    value = {
        s.name: s.value
        for f in families.values()
        for s in f.samples
        if set(s.labels) == {"model_name"}
    }
    drafts = value["swajax:spec_decode_num_drafts_total"]
    proposed = value["swajax:spec_decode_num_draft_tokens_total"]
    accepted = value["swajax:spec_decode_num_accepted_tokens_total"]
    assert drafts > 0 and proposed == 2 * drafts and 0 < accepted <= proposed
    per_position = [
        s.value
        for s in families["swajax:spec_decode_num_accepted_tokens_per_pos"].samples
        if s.name.endswith("_total")
    ]
    assert len(per_position) == 2 and sum(per_position) == accepted
    assert per_position[0] >= per_position[1]  # the second is kept only after the first
    lengths = families["swajax:spec_decode_acceptance_length"]
    count = next(s.value for s in lengths.samples if s.name.endswith("_count"))
    assert count == drafts
