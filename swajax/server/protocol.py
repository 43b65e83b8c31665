"""The OpenAI request bodies the server takes (pydantic, unknown fields refused), and how each
becomes `SamplingParams`. Names and defaults are OpenAI's (temperature 1, max_tokens 16), with
vLLM's extensions for what OpenAI lacks (top_k, min_p, repetition_penalty, stop_token_ids,
ignore_eos, allowed_token_ids, bad_words, min_tokens)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from swajax.errors import InputError
from swajax.serving.sampling_params import MAX_SAMPLES, SamplingParams

Stop = str | list[str] | None


# No coercion: `true` is not 1, "0.5" not a number; NaN and infinities are refused as such.
STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False  # a last chunk with the usage (and no choices)
    continuous_usage_stats: bool = False  # accepted; usage comes in the last chunk only


class SamplingFields(BaseModel):
    """What both endpoints share."""

    model_config = STRICT

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_SAMPLES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Unset (None): the checkpoint's generation_config.json, else OpenAI's / vLLM's defaults.
    temperature: float | None = Field(None, ge=0.0, le=1e4)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)  # vLLM: -1 or 0 is off
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=0, lt=2**32)
    stop: Stop = None
    stop_token_ids: list[StrictInt] | None = None  # strict: true is not a token id
    ignore_eos: bool = False
    user: str | None = None  # accepted and ignored, as OpenAI's servers log it
    # OpenAI's: token id (a JSON key: a string) -> a bias in [-100, 100] added to its logit.
    logit_bias: dict[str, float] | None = None
    # vLLM's extensions.
    allowed_token_ids: list[StrictInt] | None = None
    bad_words: list[str] | None = None
    min_tokens: int = Field(0, ge=0)

    def sampling(self, max_tokens: int, logprobs: int, best_of: int | None = None):
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        bias = None
        if self.logit_bias is not None:
            bias = {}
            for token, value in self.logit_bias.items():
                if not token.strip().isdigit():
                    raise InputError(f"logit_bias: key {token!r} is not a token id")
                if not -100 <= value <= 100:
                    raise InputError(f"logit_bias[{token}] = {value} is outside [-100, 100]")
                bias[int(token)] = value
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            stop=tuple(stop),
            n=self.n,
            logprobs=logprobs,
            ignore_eos=self.ignore_eos,
            logit_bias=bias,
            allowed_token_ids=self.allowed_token_ids,
            bad_words=tuple(self.bad_words or ()),
            min_tokens=self.min_tokens,
            best_of=best_of,
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


# Tried in order, ids before texts: a smart union validates a long id list against every
# branch (millions of per-item errors: seconds on the event loop for a 5 MB body).
Prompt = Annotated[
    str | list[StrictInt] | list[str] | list[list[StrictInt]], Field(union_mode="left_to_right")
]


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(
        None, ge=1, le=MAX_SAMPLES
    )  # the n best (cumulative logprob) of these
    suffix: str | None = None  # fill in the middle, where the tokenizer has FIM tokens


class ContentPart(BaseModel):
    """A part of a message's content (OpenAI's and vLLM's list form): text only here."""

    model_config = STRICT

    type: Literal["text"]
    text: str


class ToolCallFunction(BaseModel):
    model_config = STRICT

    name: str
    arguments: str | dict  # OpenAI sends a JSON string; templates also read a mapping


class ToolCall(BaseModel):
    model_config = STRICT

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    """A message as OpenAI's and vLLM's chat route take it: an assistant's `tool_calls` and
    reasoning (`reasoning_content`), a tool message's `tool_call_id`; the template reads them."""

    model_config = STRICT

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # What the template is given besides the messages (OpenAI's `tools`; vLLM's extensions):
    # the functions offered, the open generation prompt, and the template's own variables
    # (`enable_thinking`, `reasoning_effort`, ...).
    tools: list[dict] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict | None = None


def prompt_list(prompt) -> list[str | list[int]]:
    """A completion request's prompts: one text, texts, one id list, or id lists; an empty
    list (of prompts, or of one prompt's ids) is refused."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise InputError("prompt: an empty list; give a text, token ids or a list of them")
    if all(isinstance(t, int) for t in prompt):
        return [list(prompt)]
    return list(prompt)


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: a text prompt, or chat messages rendered with the template."""

    model_config = STRICT

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    # The chat route's template variables, as vLLM's /tokenize takes them.
    tools: list[dict] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict | None = None


def template_variables(body: ChatCompletionRequest | TokenizeRequest) -> dict:
    """What a chat request gives its template besides the messages."""
    variables = dict(body.chat_template_kwargs or {})
    variables.update(add_generation_prompt=body.add_generation_prompt, tools=body.tools)
    return variables


class DetokenizeRequest(BaseModel):
    model_config = STRICT

    model: str | None = None
    tokens: list[StrictInt]
