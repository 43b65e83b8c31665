"""Chat messages as OpenAI's and vLLM's clients send them: `content` a string, or a list of parts
(`{"type": "text", "text": ...}`), flattened to the string hub chat templates read (the parts'
texts joined by newlines, vLLM's "string" content format), or kept as parts for a template that
iterates over them ("openai"). Host code, no JAX."""

from __future__ import annotations

from collections.abc import Mapping

from swajax.errors import InputError

FORMATS = ("auto", "string", "openai")


def flattened(messages: list[Mapping], content_format: str = "auto") -> list[dict]:
    """`messages` with every list-of-parts content as its text ("string", and "auto": hub
    templates read `content` as a string), or as the parts themselves ("openai"). A part that is
    not text is an InputError naming it: swajax serves text."""
    if content_format not in FORMATS:
        raise InputError(
            f"chat_template_content_format must be one of {FORMATS}, got {content_format!r}"
        )
    out = []
    for i, message in enumerate(messages):
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            texts = [_text_of(part, i, j) for j, part in enumerate(content)]
            if content_format == "openai":
                message["content"] = [{"type": "text", "text": t} for t in texts]
            else:
                message["content"] = "\n".join(texts)
        out.append(message)
    return out


def _text_of(part, i: int, j: int) -> str:
    where = f"messages[{i}].content[{j}]"
    if not isinstance(part, Mapping):
        raise InputError(f"{where}: a content part is an object with a 'type', got {part!r}")
    kind = part.get("type")
    if kind != "text" or not isinstance(part.get("text"), str):
        raise InputError(f"{where}: a part of type {kind!r}; swajax serves text parts only")
    return part["text"]


def open_end(text: str, last: Mapping) -> str:
    """A rendered conversation cut right after its last message's content, which the model
    then continues (vLLM's `continue_final_message`)."""
    content = last.get("content")
    end = text.rfind(content) if isinstance(content, str) and content else -1
    if end < 0:
        raise InputError("continue_final_message: the last message's text is not in the rendering")
    return text[: end + len(content)]
