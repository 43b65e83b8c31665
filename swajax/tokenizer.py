"""Text in and out: a checkpoint's tokenizer (tokenizer.json through `tokenizers`; vocab.json +
merges.txt and SentencePiece's tokenizer.model converted into one at load) and, with `--chat`,
its chat template (through `jinja2`); bytes for the embedded model. The packages come with the
`hf` extra (`pip install 'swajax[hf]'`)."""

from __future__ import annotations

import codecs
import datetime
import json
from pathlib import Path

from swajax import special_tokens

HF_EXTRA = "install the 'hf' extra: pip install 'swajax[hf]'"
# Fill-in-the-middle tokens (prefix, suffix, middle) as code models' tokenizers spell them:
# Qwen2.5-Coder and others, StarCoder / SantaCoder, DeepSeek-Coder, Code Llama.
FIM_TOKENS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),
)


class ChatTemplate:
    """The checkpoint's Jinja chat template, rendered as transformers does for one user turn
    with the generation prompt (sandboxed; `raise_exception` as the hub templates expect)."""

    def __init__(self, folder: Path | None, source: str | None = None):
        """The template of `folder` (None: the embedded model, which has none), or `source`
        (a template's text) with the folder's special tokens."""
        config_file = folder / "tokenizer_config.json" if folder is not None else None
        config = json.loads(config_file.read_text()) if config_file and config_file.exists() else {}
        if source is not None:
            pass
        elif folder is None:
            raise ValueError("the embedded model has no chat template")
        elif (folder / "chat_template.jinja").exists():
            source = (folder / "chat_template.jinja").read_text()
        elif isinstance(config.get("chat_template"), str):
            source = config["chat_template"]
        elif isinstance(config.get("chat_template"), list):  # named templates
            named = {t.get("name"): t.get("template") for t in config["chat_template"]}
            source = named.get("default")
        if not source:
            raise ValueError(missing_template(folder, "drop --chat"))
        self.template = template_environment().from_string(source)
        self.tokens = special_tokens.named(config)  # transformers passes each to the template

    def render(self, prompt: str) -> str:
        return self.render_messages([{"role": "user", "content": prompt}])

    def render_messages(self, messages: list[dict], **kwargs) -> str:
        """A conversation (OpenAI-style role / content dicts) with the generation prompt, as
        transformers' `apply_chat_template` renders it (`tools` and `documents` None unless
        given; `kwargs` reach the template as variables)."""
        context = dict(tools=None, documents=None, add_generation_prompt=True, **self.tokens)
        return self.template.render(messages=messages, **{**context, **kwargs})


# Families that publish no chat template: their prompts are written by the publisher's own
# encoder (DeepSeek's `deepseek-recipe` for V4, the `encoding/` script of V3.2's repository), which
# transformers' `apply_chat_template` does not run either.
ENCODER_FAMILIES = {
    "deepseek_v4": "DeepSeek's encoder (pip install deepseek-recipe)",
    "deepseek_v32": "the encoding/ script its repository ships",
}


def missing_template(folder: Path, remedy: str) -> str:
    """Why `folder` has no chat to render, and `remedy` (the caller's way around it)."""
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    encoder = ENCODER_FAMILIES.get(config.get("model_type"))
    why = f"; {config['model_type']} prompts are written by {encoder}" if encoder else ""
    return (
        f"{folder} has no chat template (chat_template.jinja or tokenizer_config.json's "
        f"'chat_template'){why}: {remedy}"
    )


def template_environment():
    """A sandbox that renders hub chat templates as transformers does: blocks trimmed, loop
    controls (`{% break %}`, `{% continue %}`), the `{% generation %}` tag (its body rendered
    as is), `tojson` without HTML escaping or key sorting (non-ASCII kept; `indent`,
    `separators`, `sort_keys` and `ensure_ascii` as `json.dumps` takes them), and the globals
    `raise_exception` and `strftime_now` (gpt-oss's template dates every system message)."""
    try:
        from jinja2 import nodes
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        raise RuntimeError(f"chat templates need jinja2: {HF_EXTRA}") from e

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, Generation]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _raise(message: str):
    raise ValueError(f"chat template: {message}")


class Tokenizer:
    """tokenizer.json through `tokenizers`, or bytes for the embedded model (`path` None)."""

    def __init__(self, path: Path | None, chat: bool = False):
        self.hf = None
        self.missing = None  # a checkpoint folder without a tokenizer swajax reads: ids only
        self.chat = ChatTemplate(path) if chat else None
        if path is not None and (path / "tokenizer.json").exists():
            try:
                from tokenizers import Tokenizer as HFTokenizer
            except ImportError as e:
                raise RuntimeError(f"text prompts need the `tokenizers` package: {HF_EXTRA}") from e
            self.hf = HFTokenizer.from_file(str(path / "tokenizer.json"))
        elif path is not None and (path / "vocab.json").exists() and (path / "merges.txt").exists():
            self.hf = bpe_files(path)
        elif path is not None and (path / "tokenizer.model").exists():
            self.hf, self.missing = _sentencepiece(path)
        elif path is not None:
            self.missing = path

    def encode(self, text: str) -> list[int]:
        if self.hf is not None:
            if self.chat is not None:  # the template writes the special tokens itself
                return self.hf.encode(self.chat.render(text), add_special_tokens=False).ids
            return self.hf.encode(text).ids
        if self.missing is not None:
            raise ValueError(unreadable(self.missing))
        return list(text.encode("utf-8"))

    def fewest_tokens(self, text: str) -> int:
        """A lower bound of the tokens `text` encodes to, known without encoding it: the
        built-in byte tokenizer's exact count; 0 for a tokenizer.json (its merges decide)."""
        return len(text.encode("utf-8")) if self.hf is None and self.missing is None else 0

    def encode_rendered(self, text: str) -> list[int]:
        """Text a chat template rendered: its special tokens are in the text already."""
        if self.hf is None:
            return self.encode(text)
        return self.hf.encode(text, add_special_tokens=False).ids

    def infill(self, prefix: str, suffix: str) -> list[int]:
        """A fill-in-the-middle prompt (prefix, suffix, then the middle to generate) in the
        tokenizer's FIM tokens, the prefix-suffix-middle order the code models train on.
        ValueError if it has none."""
        tokens = self._fim_tokens()
        if tokens is None:
            known = "; ".join(" ".join(t) for t in FIM_TOKENS)
            raise ValueError(
                f"suffix: this model's tokenizer has no fill-in-the-middle tokens ({known})"
            )
        pre, suf, mid = tokens
        words = self.encode_rendered
        return [pre, *words(prefix), suf, *words(suffix), mid]

    def _fim_tokens(self) -> tuple[int, int, int] | None:
        if self.hf is None:
            return None
        for names in FIM_TOKENS:
            ids = [self.hf.token_to_id(n) for n in names]
            if all(i is not None for i in ids):
                return tuple(ids)
        return None

    def incremental(self) -> IncrementalDecoder | None:
        """A decoder fed one token at a time that returns the text each adds, in time linear
        in the output (None where `decode` gives None: no tokenizer.json)."""
        if self.hf is not None:
            return IncrementalDecoder(self.hf, None)
        if self.missing is not None:
            return None
        return IncrementalDecoder(None, codecs.getincrementaldecoder("utf-8")(errors="replace"))

    def decode(self, ids: list[int]) -> str | None:
        if self.hf is not None:
            return self.hf.decode(ids)
        if self.missing is not None:
            return None
        return bytes(ids).decode("utf-8", errors="replace")


class IncrementalDecoder:
    """Text added by each new token: `tokenizers`' DecodeStream for a tokenizer.json (which
    holds back the bytes of an unfinished character instead of showing U+FFFD), an incremental
    UTF-8 decoder for the embedded model's bytes. A character still unfinished at the end is
    left out; the whole decode of the output is the final text. Where a sequence is not valid
    text (bytes that never form a character), DecodeStream refuses to go on; the decoder then
    re-decodes the whole output per token, handing out only text that extends what it gave."""

    def __init__(self, hf, utf8):
        self.hf, self.utf8 = hf, utf8
        self.ids: list[int] = []
        self.given = ""
        self.stream = None
        if hf is not None:
            from tokenizers.decoders import DecodeStream

            # tokenizers' decode() drops special tokens by default; the stream does the same.
            self.stream = DecodeStream(skip_special_tokens=True)

    def push(self, token: int) -> str:
        if self.hf is None:
            return self.utf8.decode(bytes([token]))
        self.ids.append(token)
        if self.stream is not None:
            try:
                piece = self.stream.step(self.hf, token) or ""
                self.given += piece
                return piece
            except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception here
                self.stream = None
        text = self.hf.decode(self.ids)
        if not text.startswith(self.given):
            return ""
        piece = text[len(self.given) :].rstrip("\ufffd")
        self.given += piece
        return piece


def unreadable(path: Path) -> str:
    """Why a folder's tokenizer cannot turn text into ids here, and what to do."""
    if (path / "tokenizer.model").exists():
        try:
            _convert_sentencepiece(path)
        except (ValueError, RuntimeError) as e:
            return f"{e}; or give token ids (--prompt-ids)"
    return (
        f"{path} has no tokenizer swajax reads (tokenizer.json, vocab.json + merges.txt, or "
        "SentencePiece's tokenizer.model): give token ids (--prompt-ids)"
    )


def _sentencepiece(path: Path):
    """(tokenizer, None), or (None, path) where the model's pipeline is one swajax does not
    know or the packages that read it are missing: token ids still work, and text says why
    (`unreadable`)."""
    try:
        return _convert_sentencepiece(path), None
    except (ValueError, RuntimeError):
        return None, path


def _convert_sentencepiece(path: Path):
    try:
        import sentencepiece  # noqa: F401 - its message definition reads the file
        import tokenizers  # noqa: F401
    except ImportError as e:
        raise RuntimeError(
            f"{path}/tokenizer.model needs the packages sentencepiece and tokenizers: {HF_EXTRA}"
        ) from e
    from swajax.sentencepiece_model import sentencepiece_tokenizer

    return sentencepiece_tokenizer(path)


def bpe_files(path: Path):
    """A byte-level BPE published as vocab.json + merges.txt (GPT-2's layout, no
    tokenizer.json) as a `tokenizers` Tokenizer built the way transformers converts it: byte-level
    pre-tokenizer (tokenizer_config.json's `add_prefix_space`), decoder and post-processor, and
    the special tokens the config names."""
    try:
        from tokenizers import (
            AddedToken,
            Tokenizer as HFTokenizer,
            decoders,
            models,
            pre_tokenizers,
            processors,
        )
    except ImportError as e:
        raise RuntimeError(f"text prompts need the `tokenizers` package: {HF_EXTRA}") from e
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    tok = HFTokenizer(models.BPE.from_file(str(path / "vocab.json"), str(path / "merges.txt")))
    prefix = bool(config.get("add_prefix_space", False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    named = set(special_tokens.named(config).values())
    added = config.get("added_tokens_decoder") or {}
    named |= {t["content"] for t in added.values() if isinstance(t, dict) and t.get("content")}
    vocab = tok.get_vocab()
    tok.add_special_tokens([AddedToken(t, special=True) for t in sorted(named) if t in vocab])
    return tok
