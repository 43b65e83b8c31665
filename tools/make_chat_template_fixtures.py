"""Write tests/fixtures/chat_templates.json: chat templates exercising what hub templates use
(loop controls, `tojson` and its arguments, `strftime_now`, the `{% generation %}` tag,
namespaces, special tokens, tools, `raise_exception`), each rendered by transformers' own
`render_jinja_template` for a few conversations. The tests render the same with swajax's
environment and compare strings; today's date is written as <DATE> on both sides.

Run in an environment of its own with transformers 5.24.0 (no torch needed), from the
repository root:

    python3 -m venv hf-env && hf-env/bin/pip install transformers==5.24.0 jinja2
    hf-env/bin/python tools/make_chat_template_fixtures.py
"""

import datetime
import json
from pathlib import Path

from transformers.utils.chat_template_utils import render_jinja_template

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "chat_templates.json"

# Written for these tests (not copied from any checkpoint): each line uses a feature the
# published templates rely on.
TEMPLATES = {
    # gpt-oss's habit: the date in the system message, from strftime_now, unguarded.
    "dated_system": (
        "<|start|>system<|message|>Knowledge cutoff: 2024-06\\n"
        'Current date: {{ strftime_now("%Y-%m-%d") }}<|end|>'
        "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>"
        "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
    ),
    "loop_controls": (
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% if loop.index > 3 %}{% break %}{% endif %}[{{ m.role }}] {{ m.content }}\n"
        "{% endfor %}"
    ),
    "tojson_plain": "{% for m in messages %}{{ m | tojson }}\n{% endfor %}",
    "tojson_arguments": (
        "{{ messages | tojson(indent=2) }}|{{ messages[0] | tojson(sort_keys=True) }}|"
        "{{ messages[0] | tojson(ensure_ascii=True) }}|"
        "{{ messages[0] | tojson(separators=(',', ':')) }}"
    ),
    "tools_and_tokens": (
        "{{ bos_token }}{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    ),
    "generation_tag": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
        "<a>{{ m.content }}</a>{% endgeneration %}{% else %}<u>{{ m.content }}</u>{% endif %}"
        "{% endfor %}"
    ),
    "namespace_and_trim": (
        "{% set ns = namespace(system='') %}\n"
        "{% for m in messages %}\n"
        "  {% if m.role == 'system' %}{% set ns.system = m.content %}{% endif %}\n"
        "{% endfor %}\n"
        "SYSTEM={{ ns.system }}\n"
        "{% for m in messages if m.role != 'system' %}\n"
        "  {{ loop.index }}. {{ m.content | trim }}\n"
        "{% endfor %}"
    ),
}

CONVERSATIONS = [
    [{"role": "user", "content": 'a<b & c>d, "quoted", é ü 漢字'}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  hi  "},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and <tags>?"},
        {"role": "assistant", "content": "none"},
    ],
]
TOOLS = [{"type": "function", "function": {"name": "now", "description": "the <time>"}}]


def main() -> None:
    today = datetime.date.today().strftime("%Y-%m-%d")
    cases = []
    for name, template in TEMPLATES.items():
        for i, messages in enumerate(CONVERSATIONS):
            kwargs = dict(bos_token="<s>", eos_token="</s>", add_generation_prompt=i == 0)
            tools = TOOLS if name == "tools_and_tokens" and i == 1 else None
            (rendered,), _ = render_jinja_template(
                [messages], tools=tools, chat_template=template, **kwargs
            )
            cases.append(
                dict(
                    name=name,
                    template=template,
                    messages=messages,
                    tools=tools,
                    add_generation_prompt=i == 0,
                    expected=rendered.replace(today, "<DATE>"),
                )
            )
    OUT.write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(cases)} renders -> {OUT}")


if __name__ == "__main__":
    main()
