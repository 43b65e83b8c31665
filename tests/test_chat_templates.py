"""Chat templates render exactly as transformers renders them: every case of
tests/fixtures/chat_templates.json (written by transformers' own `render_jinja_template`, see
tools/make_chat_template_fixtures.py) through swajax's environment, string for string; and a
checkpoint whose template dates its system message (as gpt-oss's does) chats."""

import datetime
import json

import pytest
from helpers import FIXTURES

from swajax.tokenizer import ChatTemplate, template_environment

CASES = json.loads((FIXTURES / "chat_templates.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[f"{c['name']}-{i}" for i, c in enumerate(CASES)])
def test_each_template_renders_as_transformers_renders_it(case):
    got = (
        template_environment()
        .from_string(case["template"])
        .render(
            messages=case["messages"],
            tools=case["tools"],
            documents=None,
            add_generation_prompt=case["add_generation_prompt"],
            bos_token="<s>",
            eos_token="</s>",
        )
    )
    today = datetime.date.today().strftime("%Y-%m-%d")
    assert got.replace(today, "<DATE>") == case["expected"]


def test_the_fixtures_cover_each_feature():
    """The control: each feature the environment adds changes some expected string."""
    expected = "".join(c["expected"] for c in CASES)
    assert "<DATE>" in expected  # strftime_now
    assert '"a<b & c>d' in expected and "é ü 漢字" in expected  # tojson: no escaping
    assert '{"role": "user", "content"' in expected  # tojson: keys in their order
    assert "<a>hello</a>" in expected  # the generation tag's body


def test_a_checkpoint_whose_template_dates_its_system_message_chats(tmp_path):
    (case,) = [c for c in CASES if c["name"] == "dated_system" and c["add_generation_prompt"]]
    (tmp_path / "chat_template.jinja").write_text(case["template"])
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    text = ChatTemplate(tmp_path).render_messages(case["messages"])
    today = datetime.date.today().strftime("%Y-%m-%d")
    assert text.replace(today, "<DATE>") == case["expected"]


@pytest.mark.parametrize(
    ("model_type", "named"),
    [("deepseek_v4", "deepseek-recipe"), ("deepseek_v32", "encoding/"), ("qwen3", None)],
)
def test_a_family_without_a_template_is_told_what_writes_its_prompts(tmp_path, model_type, named):
    """DeepSeek V3.2 and V4 publish no chat template (their own encoders write the prompts):
    the error says so; any other folder without one gets the plain error."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    with pytest.raises(ValueError, match="has no chat template") as error:
        ChatTemplate(tmp_path)
    if named:
        assert named in str(error.value) and model_type in str(error.value)
    else:
        assert "prompts are written by" not in str(error.value)
