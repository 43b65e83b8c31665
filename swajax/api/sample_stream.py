"""One sample of one prompt as a caller follows it (host code): its tokens so far, cut at a stop
string, and the text each new token adds. Shared by `swajax.LLM` and the server."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from swajax.api.stop_strings import StopWatch
from swajax.errors import InputError
from swajax.serving.request import Request, TopN


class TokenEvent(NamedTuple):
    """One generated token: its id, logprob, top-N (or None), the text it adds (None without a
    tokenizer), and the finish reason if it is the sample's last."""

    token_id: int
    logprob: float
    top: dict[int, float] | None
    text: str | None
    finish_reason: str | None


@dataclasses.dataclass(eq=False)
class SampleStream:
    index: int  # the prompt's place
    sample: int  # which of its n samples
    rid: int  # the engine request
    watch: StopWatch
    prompt_len: int = 0
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied (set when it is done)
    seen: int = 0  # tokens handed out
    shown: str = ""  # text handed out
    decoder: object = None  # IncrementalDecoder (None: no text)
    decoded: str = ""  # the text of the first `len(ends)` output tokens
    ends: list[int] = dataclasses.field(default_factory=list)  # len(decoded) after each token

    def tokens(self, req: Request) -> list[int]:
        """The output, up to the token that completed a stop string (if one did)."""
        return req.output if self.watch.cut is None else req.output[: self.watch.cut[0]]

    def text(self, req: Request, decode) -> str | None:
        return decode(self.tokens(req)) if self.watch.cut is None else self.watch.cut[1]

    def feed(self, output: list[int]) -> None:
        """Decode the output tokens not decoded yet (each once: linear in the output)."""
        if self.decoder is None:
            return
        for token in output[len(self.ends) :]:
            self.decoded += self.decoder.push(token)
            self.ends.append(len(self.decoded))

    def stopped(self, req: Request) -> bool:
        """Whether the output now holds a stop string (then `watch.cut` says where)."""
        if not self.watch.stops or self.watch.cut is not None:
            return self.watch.cut is not None
        self.feed(req.output)
        return self.watch.check(req.output, self.decoded, self.ends, req.params.min_tokens)

    def new_events(self, req: Request, decode) -> list[TokenEvent]:
        """The tokens generated since the last call, with the text each adds (text that could
        still become a stop string is held back until the request decides it). The last
        event's text completes the whole decode of the output."""
        out, events = self.tokens(req), []
        self.feed(out)
        while self.seen < len(out):
            i = self.seen
            self.seen += 1
            last = self.seen == len(out) and req.done
            delta = None
            if self.decoder is not None:
                text = self.decoded[: self.ends[i]]
                if last:  # the whole decode completes the text, where it extends it (a text
                    whole = self.text(req, decode)  # cut mid-character may decode otherwise)
                    text = whole if whole.startswith(self.shown) else text
                shown = self.watch.visible(text, last)
                delta, self.shown = shown[len(self.shown) :], shown
            top = req.top_logprobs[i] if i < len(req.top_logprobs) else None
            events.append(
                TokenEvent(out[i], req.logprobs[i], top, delta, req.finish_reason if last else None)
            )
        return events


def add_samples(
    engine, prompt: list[int], params, index: int, tokenizer, keep_logits: bool = False
) -> list[SampleStream]:
    """Queue `params.samples` (best_of, else n) samples of `prompt` (the first computes the
    prompt, the others follow it to take its KV from the prefix cache); each draws with its own
    seed; bad words are tokenized. `keep_logits`: every
    prompt position's logits are wanted (computed, no cached prefix). If one is refused, those
    queued before it are aborted and the error raised."""
    if params.seed is None:  # the n samples' seeds derive from one the engine draws
        params = dataclasses.replace(params, seed=engine.draw_seed())
    if params.bad_words and not params.bad_words_token_ids:
        params = dataclasses.replace(params, bad_words_token_ids=bad_word_ids(params, tokenizer))
    one = dataclasses.replace(params, n=1, best_of=None)
    samples, lead = [], None
    try:
        for i in range(params.samples):
            seeded = dataclasses.replace(one, seed=params.sample_seed(i))
            rid = engine.add_request(
                prompt, seeded, follows=lead, keep_logits=keep_logits, cache_hits=not keep_logits
            )
            lead = rid if lead is None else lead
            watch = StopWatch(params.stop)
            decoder = tokenizer.incremental()
            samples.append(SampleStream(index, i, rid, watch, len(prompt), decoder=decoder))
    except Exception:
        for x in samples:
            engine.abort(x.rid)
        raise
    return samples


def prompt_logprobs(req, top: int):
    """(logprob of each prompt token given the ones before, None for the first; and the top-N
    {token: logprob} at each position) from the request's kept logits, which it then drops."""
    logits = np.asarray(req.logits[: len(req.prompt)], np.float64)
    req.logits.clear()  # a vocabulary row per position: not kept past this
    if len(logits) < len(req.prompt):  # ended before its prompt was computed (aborted)
        return [None] * len(req.prompt), [None] * len(req.prompt)
    logits -= logits.max(axis=-1, keepdims=True)
    lp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    chosen = [None] + [float(lp[i - 1, t]) for i, t in enumerate(req.prompt) if i > 0]
    tops = [None]
    for i in range(1, len(req.prompt)):
        order = np.argsort(-lp[i - 1])[:top]
        rank = 1 + int(np.sum(lp[i - 1] > lp[i - 1, req.prompt[i]]))  # the prompt token's
        entries = ([int(t) for t in order], [float(lp[i - 1, t]) for t in order])
        tops.append(TopN.of(*entries, rank) if top else None)
    return chosen, tops


def bad_word_ids(params, tokenizer) -> tuple[tuple[int, ...], ...]:
    """Each bad word as token ids, as written and with one leading space (how a word is
    tokenized mid-text; vLLM bans both forms), without special tokens; distinct forms only."""
    if tokenizer.missing is not None:
        raise InputError(f"bad_words {params.bad_words!r} need the checkpoint's tokenizer.json")
    forms = {}
    for word in params.bad_words:
        for text in (word, " " + word.lstrip()):
            ids = tuple(tokenizer.encode_rendered(text))
            if ids:
                forms[ids] = None
    return tuple(forms)


def best(samples: list[SampleStream], reqs, n: int) -> list[SampleStream]:
    """best_of: the n samples with the highest cumulative logprob (ties: the earlier), in that
    order."""
    if len(samples) <= n:
        return samples
    score = [math.fsum(r.logprobs[: len(x.tokens(r))]) for x, r in zip(samples, reqs)]
    order = sorted(range(len(samples)), key=lambda i: (-score[i], i))
    return [samples[i] for i in order[:n]]
