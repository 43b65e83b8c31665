"""Write tests/fixtures/published_templates/cases.json: the chat templates published with the
families swajax serves, each rendered by transformers' own `apply_chat_template` (text and token
ids) for the conversations, tools and reasoning settings the family uses. The tests render the
same with swajax and compare (tests/test_published_templates.py).

The templates are the publishers' text, committed beside the cases (`*.jinja`; README.md there
says where each comes from); Llama 4's is the one transformers ships with its processor, written
out by this script. Token ids use the small byte-level BPE of tests/fixtures/bpe_files (the
templates' special tokens are not in it, so they tokenize as text on both sides): the check is
that the same text reaches the same tokenizer the same way. The date templates print is fixed
(2026-03-14) on both sides.

Run in an environment with transformers 5.24.0 and jinja2 (the SGLang peer's has them), from the
repository root:

    .venvs/sglang/bin/python tools/make_published_template_fixtures.py
"""

import datetime
import json
from pathlib import Path

import transformers.utils.chat_template_utils as chat_utils
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "published_templates"
BPE = ROOT / "tests" / "fixtures" / "bpe_files"
DATE = datetime.datetime(2026, 3, 14, 9, 26, 53)


class _FixedDate(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return DATE


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather <now> in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "a city"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["location"],
            },
        },
    }
]
PLAIN = [{"role": "user", "content": 'What is 2 + 2? Say it in <b>bold</b> & "quotes", é 漢字.'}]
TURNS = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "and now?"},
]
CALL = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "abc123xyz",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"location": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "abc123xyz", "name": "get_weather", "content": "18 C"},
]
PARTS = [{"role": "user", "content": [{"type": "text", "text": "Describe   this."}]}]
# A system turn in parts and an image placeholder part (Gemma 3 reads both; the text-only
# templates show or refuse them as they do in transformers).
IMAGE_PARTS = [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is it? "}]},
]
# Each family's own settings: what its model card tells users to pass.
SETTINGS = {
    "gpt-oss": [dict(reasoning_effort="high"), dict(model_identity="You are a test.")],
    "qwen3": [dict(enable_thinking=False)],
    "gemma-3": [],
    "gemma-4": [dict(enable_thinking=True)],
    "step-3.5-flash": [],
    "mistral-small-3.2": [],
    "mimo-vl": [],
    "llama-4": [dict(date_string="01 Jan 2026")],
}
# An assistant turn with the reasoning field each family reads.
REASONED = {
    "gpt-oss": "thinking",
    "qwen3": "reasoning_content",
    "gemma-4": "reasoning_content",
    "step-3.5-flash": "reasoning_content",
}


def conversations(name: str):
    yield "plain", PLAIN, None, dict(add_generation_prompt=True)
    yield "turns", TURNS, None, dict(add_generation_prompt=True)
    yield "turns_closed", TURNS[:3], None, dict(add_generation_prompt=False)
    yield "tools", CALL[:1], TOOLS, dict(add_generation_prompt=True)
    yield "tool_call", CALL, TOOLS, dict(add_generation_prompt=True)
    yield "text_parts", PARTS, None, dict(add_generation_prompt=True)
    yield "image_parts", IMAGE_PARTS, None, dict(add_generation_prompt=True)
    for i, extra in enumerate(SETTINGS[name]):
        yield f"setting_{i}", PLAIN, None, dict(add_generation_prompt=True, **extra)
    if name in REASONED:
        reasoned = [
            PLAIN[0],
            {"role": "assistant", "content": "**4**", REASONED[name]: "2 + 2 = 4."},
        ]
        yield "reasoned", reasoned, None, dict(add_generation_prompt=False)


def main() -> None:
    from transformers.models.llama4 import processing_llama4

    (OUT / "llama-4.jinja").write_text(processing_llama4.chat_template)
    chat_utils.datetime = _FixedDate
    tokenizer = AutoTokenizer.from_pretrained(BPE)
    cases = []
    for name in SETTINGS:
        template = (OUT / f"{name}.jinja").read_text()
        for case, messages, tools, kwargs in conversations(name):
            row = dict(template=name, case=case, messages=messages, tools=tools, kwargs=kwargs)
            try:
                text = tokenizer.apply_chat_template(
                    messages, tools=tools, chat_template=template, tokenize=False, **kwargs
                )
            except Exception as error:  # noqa: BLE001 - the template refuses: so must swajax
                row["error"] = str(error)
            else:
                row["text"] = text
                row["ids"] = tokenizer(text, add_special_tokens=False)["input_ids"]
            cases.append(row)
    (OUT / "cases.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")
    refused = sum("error" in c for c in cases)
    print(f"{len(cases)} renders ({refused} refused by their template) -> {OUT / 'cases.json'}")


if __name__ == "__main__":
    main()
