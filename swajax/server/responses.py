"""OpenAI's response shapes, built from a job's events: `Completion` (text_completion, with
echo and prompt logprobs) and `Chat` (chat.completion), whole or as stream chunks.

A shape `take`s every message of its job (tokens as steps finish, then "done" with the prompt
logprobs of an echo); `body()` is the whole response, `chunks(message)` the stream's chunks
for one message. Choices are numbered prompt by prompt, the n samples of each in turn.
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid


@dataclasses.dataclass
class _Choice:
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    tops: list = dataclasses.field(default_factory=list)
    text: str = ""
    finish: str | None = None
    prompt: tuple | None = None  # echo: (token_logprobs, tops) of the prompt


class _Shape:
    object_name = ""

    def __init__(self, decode, model: str, body):
        self.decode, self.model, self.body_in = decode, model, body
        self.n = body.n  # choices per prompt
        self.drawn = getattr(body, "best_of", None) or body.n  # samples per prompt
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.choices: dict[int, _Choice] = {}
        self.prompt_tokens: dict[int, int] = {}
        self.cached_tokens: dict[int, int] = {}  # per prompt: its first sample's

    def _choice(self, x) -> tuple[int, _Choice]:
        i = x.index * self.drawn + x.sample
        return i, self.choices.setdefault(i, _Choice())

    def take(self, message) -> list[tuple[int, object]]:
        """Record a message; returns the (choice, event) pairs it added."""
        added = []
        if message[0] == "tokens":
            _, x, events = message
            i, c = self._choice(x)
            self.prompt_tokens[x.index] = x.prompt_len
            for e in events:
                c.tokens.append(e.token_id)
                c.logprobs.append(e.logprob)
                c.tops.append(e.top)
                c.text += e.text or ""
                c.finish = e.finish_reason or c.finish
                added.append((i, e))
        elif message[0] == "done":
            for x, reason, prompt in message[1]:
                i, c = self._choice(x)
                self.prompt_tokens[x.index] = x.prompt_len
                self.cached_tokens.setdefault(x.index, x.cached_tokens)
                c.finish, c.prompt = reason, prompt
        return added

    def failure(self) -> str | None:
        """The reason of the first sample that ended in an error or abort, if any."""
        for c in self.choices.values():
            if c.finish is not None and c.finish not in ("stop", "length"):
                return c.finish
        return None

    def usage(self) -> dict:
        prompt = sum(self.prompt_tokens.values())
        completion = sum(len(c.tokens) for c in self.choices.values())
        cached = sum(self.cached_tokens.values())
        return dict(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=dict(cached_tokens=cached),  # OpenAI's (and vLLM's) field
        )

    def _head(self) -> dict:
        return dict(id=self.id, object=self.object_name, created=self.created, model=self.model)

    def usage_chunks(self, message, chunk_object: str) -> list[dict]:
        """`stream_options.include_usage`: after the last message, a chunk with the usage and
        no choices (OpenAI's shape)."""
        if message[0] != "done" or not self.body_in.include_usage:
            return []
        head = dict(self._head(), object=chunk_object)
        return [dict(**head, choices=[], usage=self.usage())]

    def _piece(self, t: int) -> str:
        return self.decode([t]) or ""


class Completion(_Shape):
    prefix, object_name = "cmpl", "text_completion"

    def __init__(self, decode, model: str, body, prompts: list[list[int]], echo_only: bool):
        super().__init__(decode, model, body)
        self.prompts, self.echo, self.echo_only = prompts, body.echo, echo_only
        self.want_logprobs = body.logprobs is not None

    def _logprobs(self, tokens, lps, tops) -> dict:
        pieces = [self._piece(t) for t in tokens]
        offsets, at = [], 0
        for p in pieces:
            offsets.append(at)
            at += len(p)
        return dict(
            tokens=pieces,
            token_logprobs=lps,
            text_offset=offsets,
            top_logprobs=[
                None if top is None else {self._piece(t): v for t, v in top.items()} for top in tops
            ],
        )

    def _choice_body(self, i: int, c: _Choice, prompt_ids) -> dict:
        tokens, lps, tops, text = c.tokens, c.logprobs, c.tops, c.text
        if self.echo_only:
            tokens, lps, tops, text = [], [], [], ""
        if self.echo:
            text = self.decode(prompt_ids) + text
            tokens = list(prompt_ids) + tokens
            lps, tops = list(c.prompt[0]) + lps, list(c.prompt[1]) + tops
        logprobs = self._logprobs(tokens, lps, tops) if self.want_logprobs else None
        finish = "length" if self.echo_only else c.finish
        return dict(index=i, text=text, logprobs=logprobs, finish_reason=finish)

    def body(self) -> dict:
        choices = []
        for p, prompt in enumerate(self.prompts):
            for i in self._best(p):
                choices.append(self._choice_body(len(choices), self.choices[i], prompt))
        return dict(**self._head(), choices=choices, usage=self.usage())

    def _best(self, p: int) -> list[int]:
        """Prompt p's choices: its samples, or with best_of its n with the highest cumulative
        logprob, best first (ties: the earlier). Usage counts every sample drawn."""
        mine = [i for i in range(p * self.drawn, (p + 1) * self.drawn) if i in self.choices]
        if self.drawn == self.n:
            return mine
        score = {i: math.fsum(self.choices[i].logprobs) for i in mine}
        return sorted(mine, key=lambda i: (-score[i], i))[: self.n]

    def first_chunks(self) -> list[dict]:
        return []

    def chunks(self, message) -> list[dict]:
        out = []
        for i, e in self.take(message):
            lp = None
            if self.want_logprobs:
                lp = self._logprobs([e.token_id], [e.logprob], [e.top])
            choice = dict(index=i, text=e.text or "", logprobs=lp, finish_reason=e.finish_reason)
            out.append(dict(**self._head(), choices=[choice]))
        return out + _errors(self, message) + self.usage_chunks(message, self.object_name)


class Chat(_Shape):
    prefix, object_name = "chatcmpl", "chat.completion"

    def __init__(self, decode, model: str, body):
        super().__init__(decode, model, body)
        self.want_logprobs = body.logprobs
        self.top = body.top_logprobs or 0

    def _entry(self, t: int, lp: float, top) -> dict:
        piece = self._piece(t)
        ranked = list((top or {}).items())[: self.top]
        tops = [
            dict(token=self._piece(u), logprob=v, bytes=list(self._piece(u).encode()))
            for u, v in ranked
        ]
        return dict(token=piece, logprob=lp, bytes=list(piece.encode()), top_logprobs=tops)

    def body(self) -> dict:
        choices = []
        for i in sorted(self.choices):
            c = self.choices[i]
            logprobs = None
            if self.want_logprobs:
                entries = zip(c.tokens, c.logprobs, c.tops)
                logprobs = dict(content=[self._entry(*x) for x in entries])
            choices.append(
                dict(
                    index=i,
                    message=dict(role="assistant", content=c.text),
                    logprobs=logprobs,
                    finish_reason=c.finish,
                )
            )
        return dict(**self._head(), choices=choices, usage=self.usage())

    def first_chunks(self) -> list[dict]:
        return [
            self._chunk(i, dict(role="assistant", content=""), None, None) for i in range(self.n)
        ]

    def _chunk(self, i, delta, logprobs, finish) -> dict:
        head = dict(self._head(), object="chat.completion.chunk")
        return dict(
            **head, choices=[dict(index=i, delta=delta, logprobs=logprobs, finish_reason=finish)]
        )

    def chunks(self, message) -> list[dict]:
        out = []
        for i, e in self.take(message):
            lp = None
            if self.want_logprobs:
                lp = dict(content=[self._entry(e.token_id, e.logprob, e.top)])
            out.append(self._chunk(i, dict(content=e.text or ""), lp, e.finish_reason))
        return out + _errors(self, message) + self.usage_chunks(message, "chat.completion.chunk")


def _errors(shape: _Shape, message) -> list[dict]:
    """A stream's error event when the job ended with a sample aborted or failed."""
    if message[0] != "done" or shape.failure() is None:
        return []
    return [{"error": {"message": shape.failure(), "type": "server_error", "code": 500}}]
