"""The chat templates the families publish render as transformers renders them: every case of
tests/fixtures/published_templates/cases.json (transformers 5.24's `apply_chat_template`, text
and token ids, tools and each family's reasoning settings, written by
tools/make_published_template_fixtures.py) through swajax's template environment and tokenizer,
and through `LLM.chat`. A case the
template refuses in transformers is refused here too. The date the templates print is fixed on
both sides."""

import datetime
import json
import shutil

import numpy as np
import pytest
from helpers import FIXTURES

import swajax.tokenizer as tokenizer_module
from swajax.tokenizer import ChatTemplate, Tokenizer

FOLDER = FIXTURES / "published_templates"
CASES = json.loads((FOLDER / "cases.json").read_text())
BPE = FIXTURES / "bpe_files"
DATE = datetime.datetime(2026, 3, 14, 9, 26, 53)


class _FixedDate(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return DATE


@pytest.fixture(autouse=True)
def fixed_date(monkeypatch):
    fixed = type("datetime_module", (), {"datetime": _FixedDate})
    monkeypatch.setattr(tokenizer_module, "datetime", fixed)


def _tokenizer_folder(tmp_path, template: str):
    folder = tmp_path / template
    shutil.copytree(BPE, folder)
    (folder / "expected.json").unlink()
    shutil.copy(FOLDER / f"{template}.jinja", folder / "chat_template.jinja")
    return folder


def _variables(case) -> dict:
    return dict(case["kwargs"], tools=case["tools"])


@pytest.mark.parametrize("case", CASES, ids=[f"{c['template']}-{c['case']}" for c in CASES])
def test_each_published_template_renders_as_transformers_renders_it(case, tmp_path):
    folder = _tokenizer_folder(tmp_path, case["template"])
    template = ChatTemplate(folder)
    if "error" in case:
        with pytest.raises(Exception):  # noqa: B017 - whatever the template itself raises
            template.render_messages(case["messages"], **_variables(case))
        return
    text = template.render_messages(case["messages"], **_variables(case))
    assert text == case["text"]
    assert Tokenizer(folder).encode_rendered(text) == case["ids"]


def test_the_cases_cover_the_families_and_their_settings():
    """The control: each family, its tools, a tool call and its reasoning setting render, and
    the settings change the text (so a setting dropped on the way would be seen)."""
    rendered = {(c["template"], c["case"]): c.get("text") for c in CASES}
    families = {c["template"] for c in CASES}
    assert families == {
        "gpt-oss",
        "qwen3",
        "gemma-3",
        "gemma-4",
        "step-3.5-flash",
        "mistral-small-3.2",
        "mimo-vl",
        "llama-4",
    }
    for family in families - {"gemma-3"}:
        assert rendered[(family, "tools")] and "get_weather" in rendered[(family, "tools")]
        assert rendered[(family, "tool_call")]
    # Gemma 3's template takes no tools and refuses a tool turn; it reads a system turn in parts
    # and an image part.
    assert "get_weather" not in rendered[("gemma-3", "tools")]
    assert rendered[("gemma-3", "tool_call")] is None
    assert "Be brief.\n\n<start_of_image>What is it?" in rendered[("gemma-3", "image_parts")]
    assert rendered[("gpt-oss", "plain")] != rendered[("gpt-oss", "setting_0")]
    assert "Reasoning: high" in rendered[("gpt-oss", "setting_0")]
    assert "2026-03-14" in rendered[("gpt-oss", "plain")]  # its unguarded strftime_now
    assert rendered[("qwen3", "plain")] != rendered[("qwen3", "setting_0")]
    assert rendered[("gemma-4", "plain")] != rendered[("gemma-4", "setting_0")]
    assert any("error" in c for c in CASES)


def _model_for(tmp_path, template: str):
    """A small random-weight Qwen3 checkpoint whose vocabulary holds the BPE tokenizer's."""
    from safetensors.numpy import load_file, save_file

    folder = _tokenizer_folder(tmp_path, template)
    config = json.loads((FIXTURES / "qwen3" / "config.json").read_text())
    vocab = len(json.loads((BPE / "vocab.json").read_text()))
    config["vocab_size"] = vocab
    config["max_position_embeddings"] = 4096  # the tool-calling prompts run to a thousand
    (folder / "config.json").write_text(json.dumps(config))
    weights = load_file(FIXTURES / "qwen3" / "model.safetensors")
    rng = np.random.default_rng(0)
    for name in ("lm_head.weight", "model.embed_tokens.weight"):
        width = weights[name].shape[1]
        weights[name] = (rng.normal(size=(vocab, width)) * 0.02).astype(np.float32)
    save_file(weights, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("template", ["gpt-oss", "qwen3", "llama-4"])
def test_llm_chat_renders_the_published_template(template, tmp_path):
    """LLM.chat (vLLM's keywords: tools, chat_template_kwargs) sends the model exactly the text
    and ids transformers gives, for each case of the family (text parts aside: LLM.chat joins
    them into a string, as vLLM does for a template that reads strings; image parts aside: the
    model reads text only, and LLM.chat says so)."""
    from swajax import LLM, SamplingParams

    folder = _model_for(tmp_path, template)
    llm = LLM(str(folder), kv_budget_gib=0.01, page_size=4)
    cases = [
        c
        for c in CASES
        if c["template"] == template
        and "error" not in c
        and c["case"] not in ("text_parts", "image_parts")
    ]
    for case in cases:
        kwargs = dict(case["kwargs"])
        generation = kwargs.pop("add_generation_prompt")
        (out,) = llm.chat(
            case["messages"],
            SamplingParams(max_tokens=1, temperature=0.0),
            use_tqdm=False,
            tools=case["tools"],
            add_generation_prompt=generation,
            chat_template_kwargs=kwargs,
        )
        assert out.prompt == case["text"], case["case"]
        assert list(out.prompt_token_ids) == case["ids"], case["case"]


def test_the_servers_chat_route_renders_the_published_template(tmp_path):
    """`swajax serve` on a checkpoint carrying gpt-oss's template: /tokenize with the chat
    request's fields (messages, tools, chat_template_kwargs, add_generation_prompt, as vLLM's
    /tokenize takes them) gives transformers' ids for every case the OpenAI message form carries
    (tool calls, tool results; gpt-oss's `thinking` field is not OpenAI's), and
    /v1/chat/completions takes the same request and counts the same prompt tokens. The server
    dates its system message today: the expected text is transformers' with today's date in
    place of the fixed one, tokenized by the same tokenizer (the other tests compare it with
    transformers')."""
    from helpers.server import http, serve

    folder = _model_for(tmp_path, "gpt-oss")
    today = datetime.date.today().strftime("%Y-%m-%d")
    tokenizer = Tokenizer(folder)
    proc, url = serve(folder, ["--kv-budget-gib", "0.01", "--page-size", "4"], tmp_path / "log")
    try:
        cases = [
            c
            for c in CASES
            if c["template"] == "gpt-oss"
            and "error" not in c
            and not any("thinking" in m for m in c["messages"])
        ]
        assert len(cases) >= 6
        for case in cases:
            fields = dict(messages=case["messages"], tools=case["tools"])
            kwargs = dict(case["kwargs"])
            fields["add_generation_prompt"] = kwargs.pop("add_generation_prompt")
            fields["chat_template_kwargs"] = kwargs
            ids = tokenizer.encode_rendered(case["text"].replace(DATE.strftime("%Y-%m-%d"), today))
            status, body = http(f"{url}/tokenize", fields)
            assert status == 200, body
            assert json.loads(body)["tokens"] == ids, case["case"]
            status, body = http(f"{url}/v1/chat/completions", dict(fields, max_tokens=1))
            assert status == 200, body
            assert json.loads(body)["usage"]["prompt_tokens"] == len(ids), case["case"]
    finally:
        proc.terminate()
        proc.wait(30)
