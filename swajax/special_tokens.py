"""The special tokens a tokenizer names, as transformers reads them from tokenizer_config.json:
its named attributes (in transformers' order; chat templates receive each one named), written
as a string or as an added token's {"content": ...}."""

from __future__ import annotations

NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def content(value) -> str:
    """A config entry's token text ("" where it names none)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def named(config: dict) -> dict[str, str]:
    """The named special tokens `config` gives, by attribute."""
    return {k: content(config.get(k)) for k in NAMED if content(config.get(k))}
