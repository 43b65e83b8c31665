"""vLLM's offline examples as users have them (basic, default sampling, chat, logprobs, prefix
caching, the tokenizer's chat template), with only the import and the model changed (and the
test's small pools): written in vLLM's style, calling what those examples call."""

import math

import pytest
from helpers.server import LLM_SETTINGS, demo_folder

from swajax import LLM, SamplingParams
from swajax.errors import RequestError

PROMPTS = ["Hello, my name is", "The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(model=str(demo_folder(tmp_path_factory.mktemp("m") / "demo")), **LLM_SETTINGS)


def test_basic(llm):
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16, seed=0)
    outputs = llm.generate(PROMPTS, sampling_params)
    for prompt, output in zip(PROMPTS, outputs):
        assert output.prompt == prompt and isinstance(output.outputs[0].text, str)
        assert len(output.outputs[0].token_ids) <= 16


def test_default_sampling_params_a_script_changes(llm):
    sampling_params = llm.get_default_sampling_params()
    sampling_params.max_tokens = 12
    sampling_params.temperature = 0.0
    outputs = llm.generate(PROMPTS, sampling_params)
    assert all(len(o.outputs[0].token_ids) <= 12 for o in outputs)
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12))
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in greedy]
    with pytest.raises(RequestError, match="top_p"):
        sampling_params.top_p = 2.0  # checked as the constructor checks
    assert sampling_params.top_p is None  # and left as it was
    with pytest.raises(AttributeError, match="no field"):
        sampling_params.max_new_tokens = 3


def test_chat(llm):
    conversation = [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hello! How can I assist you today?"},
        {"role": "user", "content": "Write an essay about the importance of higher education."},
    ]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    outputs = llm.chat(conversation, params, use_tqdm=False)
    assert outputs[0].outputs[0].text is not None
    # Content as a list of parts (OpenAI's form) renders as the string it joins.
    parts = [
        {**m, "content": [{"type": "text", "text": m["content"]}]} if m["role"] == "user" else m
        for m in conversation
    ]
    again = llm.chat([conversation, parts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == [outputs[0].outputs[0].token_ids] * 2
    # vLLM's keywords: a template given as text, its variables, an open last message.
    mine = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{{ suffix }}"
    out = llm.chat(
        conversation,
        params,
        chat_template=mine,
        chat_template_kwargs={"suffix": "[assistant]"},
        use_tqdm=False,
    )
    assert out[0].prompt.endswith("higher education.\n[assistant]")
    tail = [*conversation, {"role": "assistant", "content": "Higher education is"}]
    out = llm.chat(
        tail, params, add_generation_prompt=False, continue_final_message=True, use_tqdm=False
    )
    assert out[0].prompt.endswith("Higher education is")
    with pytest.raises(Exception, match="text parts only"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])


def test_the_tokenizers_chat_template_is_the_chats(llm):
    tokenizer = llm.get_tokenizer()
    messages = [{"role": "user", "content": "Hi there"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert tokenizer.decode(ids) == text and tokenizer.encode(text, add_special_tokens=False) == ids
    params = SamplingParams(temperature=0.0, max_tokens=6)
    by_text = llm.generate(text, params)[0].outputs[0].token_ids
    assert by_text == llm.chat(messages, params, use_tqdm=False)[0].outputs[0].token_ids
    assert len(tokenizer) >= tokenizer.vocab_size > 0
    assert tokenizer.convert_tokens_to_ids(tokenizer.convert_ids_to_tokens(ids)) == ids


def test_logprobs(llm):
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=3, prompt_logprobs=2)
    output = llm.generate(PROMPTS[0], params)[0]
    for token, position in zip(output.outputs[0].token_ids, output.outputs[0].logprobs):
        chosen = position[token]
        assert chosen.rank == 1 and chosen.logprob <= 0  # greedy: the likeliest
        assert chosen.decoded_token == llm.get_tokenizer().decode([token])
        ranks = sorted(lp.rank for lp in position.values())
        assert ranks == [1, 2, 3]
        assert all(isinstance(lp, float) for lp in position.values())  # still floats
    assert math.isclose(
        output.outputs[0].cumulative_logprob,
        sum(p[t].logprob for t, p in zip(output.outputs[0].token_ids, output.outputs[0].logprobs)),
        rel_tol=1e-9,
    )
    # Drawn hot: the sampled token's rank is the step's own, exact outside the top-N too.
    hot = SamplingParams(temperature=5.0, seed=3, max_tokens=16, logprobs=2)
    out = llm.generate(PROMPTS[2], hot)[0].outputs[0]
    beyond = 0
    for token, position in zip(out.token_ids, out.logprobs):
        chosen, top = position[token], sorted(position.values(), reverse=True)
        if chosen.rank <= 2:
            assert top[chosen.rank - 1].logprob == chosen.logprob
        else:
            assert len(position) == 3 and chosen.logprob <= min(top[:2])
            beyond += 1
    assert beyond > 0
    assert output.prompt_logprobs[0] is None
    for token, position in zip(output.prompt_token_ids[1:], output.prompt_logprobs[1:]):
        assert position[token].logprob <= 0 and len(position) <= 3
        assert all(lp.rank in (1, 2) for t, lp in position.items() if t != token)
        higher = [lp for t, lp in position.items() if t != token and lp > position[token]]
        assert position[token].rank >= 1 + len(higher)


def test_prefix_caching(tmp_path):
    model = str(demo_folder(tmp_path / "demo"))
    prefix = "You are an expert school principal, skilled in effectively managing faculty. " * 3
    prompts = [prefix + q for q in ("Hello, my name is", "The capital of France is")]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    plain = LLM(model=model, **LLM_SETTINGS, enable_prefix_caching=False)
    want = [o.outputs[0].text for o in plain.generate(prompts, params)]
    cached = LLM(model=model, **LLM_SETTINGS, enable_prefix_caching=True)
    warm = cached.generate(prompts[0], params)  # warm the cache
    outputs = cached.generate(prompts, params)
    assert [o.outputs[0].text for o in outputs] == want
    metrics = {m.name: m for m in cached.get_metrics() if m.name != "vllm:request_success"}
    lengths = [len(o.prompt_token_ids) for o in warm + outputs]
    assert metrics["vllm:prompt_tokens"].value == sum(lengths)
    assert metrics["vllm:prefix_cache_hits"].value == sum(o.num_cached_tokens for o in outputs) > 0
    generated = sum(len(o.outputs[0].token_ids) for o in warm + outputs)
    assert metrics["vllm:generation_tokens"].value == generated
    assert metrics["vllm:num_requests_running"].value == 0
    finished = [m for m in cached.get_metrics() if m.name == "vllm:request_success"]
    assert sum(m.value for m in finished) == 3


def test_vllm_engine_arguments_by_their_names():
    """LLM(...) takes vLLM's names for swajax's settings, warns for the ones that have no
    effect here (naming why), and refuses the ones it cannot honour (the same table as the
    command line's: swajax.foreign_flags)."""
    from swajax.api.llm import engine_settings
    from swajax.errors import InputError

    fields = engine_settings(
        dict(max_num_seqs=4, max_num_batched_tokens=128, block_size=16, kv_cache_dtype="fp8")
    )
    assert fields == dict(max_running=4, chunk_size=128, page_size=16, kv_dtype="fp8_e4m3")
    for name, value in (
        ("trust_remote_code", True),
        ("enforce_eager", True),
        ("cpu_offload_gb", 4),
    ):
        with pytest.warns(UserWarning, match=f"{name}={value!r} has no effect here: "):
            assert engine_settings({name: value}) == {}
    assert engine_settings(dict(pipeline_parallel_size=1)) == {}
    for name, value, why in (
        ("enable_lora", True, "LoRA"),
        ("pipeline_parallel_size", 2, "pipeline"),
        ("tool_call_parser", "hermes", "tool calls"),
    ):
        with pytest.raises(InputError, match=why):
            engine_settings({name: value})
    with pytest.raises(InputError, match="unknown setting 'max_num_seq'"):
        engine_settings(dict(max_num_seq=4))
