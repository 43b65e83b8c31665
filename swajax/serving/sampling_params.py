"""`SamplingParams`: how one request samples and when it stops (host code, validated on
construction; a bad value is a `RequestError` naming the field and its limit).

The fields and their meaning follow vLLM's and transformers' names: the processing order is
transformers' (repetition penalty, presence / frequency penalties on the raw logits, then
temperature, top-k, top-p, min-p); `models/sampling.py` applies them inside the step's jit.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from swajax.errors import RequestError

# What the step program can represent: counts and ids are packed as int32 and every float
# field as float32 (`serving/batch.py`), so a value beyond these is refused here, naming it.
INT32_MAX = 2**31 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


# Samples of one prompt (n, best_of): each is a running sequence, and one request should not
# take every row (the server's bound, OpenAI's for n is 128).
MAX_SAMPLES = 64


def _is_int(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, int | float | np.floating | np.integer) and not isinstance(value, bool)


# What a field left unset (None) samples with when the checkpoint's generation_config.json does
# not say: vLLM's defaults, which keep the model's distribution as it is.
NEUTRAL = dict(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one request samples and stops: vLLM's `SamplingParams`, field for field in name,
    meaning and default.

    `temperature`, `top_p`, `top_k`, `min_p` and `repetition_penalty` left as None take the
    checkpoint's `generation_config.json` values where it sets them, else the neutral ones
    (`NEUTRAL`: temperature 1, nothing cut, no penalty); `resolved` fills them in.
    `temperature` 0 is greedy (the penalties still apply); `top_k` 0 or -1 and `top_p` 1 and
    `min_p` 0 keep every token; `repetition_penalty` (transformers': divides a positive logit,
    multiplies a negative one, of every token in the prompt or the output) 1 is off;
    `presence_penalty` and `frequency_penalty` (OpenAI's: subtract per output occurrence) 0 are
    off. `seed` and the position key every draw, so a request samples the same tokens however
    it is batched; None draws a seed from the engine's generator (`LLM(seed=)`).
    `stop_token_ids` and `stop` (strings, matched on the detokenized text by `swajax.LLM`; the
    text stops before the string, the tokens after the one that completed it are dropped)
    finish the request, as do the checkpoint's eos ids unless `ignore_eos`. `max_tokens`: the
    most tokens generated. `n` samples per prompt share the prompt's KV (one prefill);
    `logprobs` N > 0 returns the N most likely tokens' logprobs at every generated position,
    `prompt_logprobs` N at every prompt position (logprobs are always of the model's raw
    distribution, before any processing). `best_of` (>= n) samples are drawn and the n with
    the highest cumulative logprob returned (`swajax.LLM`).

    Token rules, applied to the raw logits before the penalties: `logit_bias` {token id: bias}
    adds each bias to its token's logit; `allowed_token_ids` keeps only those tokens;
    `bad_words` (strings) are never completed: a word of one token is banned, one of several
    has its last token banned where the output ends with the others (`swajax.LLM` tokenizes
    each with and without a leading space into `bad_words_token_ids`, which an engine user may
    give directly); `min_tokens` bans the stop tokens (eos included) and ignores stop strings
    until the output has that many tokens."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    max_tokens: int = 16
    logprobs: int | None = None  # top-N logprobs per generated token (None or 0: none)
    prompt_logprobs: int | None = None  # top-N logprobs per prompt position (None: none)
    min_tokens: int = 0
    best_of: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):
        if self.top_k == -1:  # vLLM's older spelling of "off"
            object.__setattr__(self, "top_k", 0)
        for name in ("logprobs",):
            if getattr(self, name) is None:
                object.__setattr__(self, name, 0)
        optional = ("top_k", "prompt_logprobs", "best_of")
        for name, lo in (
            ("max_tokens", 1),
            ("top_k", 0),
            ("n", 1),
            ("logprobs", 0),
            ("prompt_logprobs", 0),
            ("min_tokens", 0),
            ("best_of", 1),
        ):
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            if not _is_int(value) or not lo <= value <= INT32_MAX:
                raise RequestError(f"{name} must be an integer in [{lo}, 2**31), got {value!r}")
        for name in (
            "temperature",
            "top_p",
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
        ):
            value = getattr(self, name)
            if value is None and name in NEUTRAL:
                continue
            if not _is_number(value) or not math.isfinite(value) or abs(value) > FLOAT32_MAX:
                raise RequestError(
                    f"{name} must be a finite number (float32: |x| <= {FLOAT32_MAX:.4g}), "
                    f"got {value!r}"
                )
        if self.temperature is not None and self.temperature < 0:
            raise RequestError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.top_p is not None and not (0 < self.top_p <= 1):
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.min_p is not None and not (0 <= self.min_p <= 1):
            raise RequestError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.repetition_penalty is not None and self.repetition_penalty <= 0:
            raise RequestError(
                f"repetition_penalty must be > 0 (1: off), got {self.repetition_penalty!r}"
            )
        if self.seed is not None and (not _is_int(self.seed) or not (0 <= self.seed < 2**32)):
            raise RequestError(f"seed must be an integer in [0, 2**32), got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise RequestError(f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        object.__setattr__(self, "stop_token_ids", _stop_ids(self.stop_token_ids))
        object.__setattr__(self, "stop", _stop_strings(self.stop))
        if self.min_tokens > self.max_tokens:
            raise RequestError(
                f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})"
            )
        for name in ("n", "best_of"):
            if (getattr(self, name) or 0) > MAX_SAMPLES:
                raise RequestError(
                    f"{name} must be at most {MAX_SAMPLES} (samples of one prompt), "
                    f"got {getattr(self, name)}"
                )
        if self.best_of is not None and self.best_of < self.n:
            raise RequestError(f"best_of ({self.best_of}) must be >= n ({self.n})")
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        if self.allowed_token_ids is not None:
            ids = _token_ids("allowed_token_ids", self.allowed_token_ids)
            if not ids:
                raise RequestError("allowed_token_ids is empty: no token could be sampled")
            object.__setattr__(self, "allowed_token_ids", ids)
        words = _stop_strings(self.bad_words, "bad_words")
        object.__setattr__(self, "bad_words", words)
        seqs = self.bad_words_token_ids
        if isinstance(seqs, str | bytes) or not hasattr(seqs, "__iter__"):
            raise RequestError(f"bad_words_token_ids must be token id sequences, got {seqs!r}")
        seqs = tuple(_token_ids("bad_words_token_ids", w) for w in seqs)
        if any(not w for w in seqs):
            raise RequestError("bad_words_token_ids holds an empty sequence")
        object.__setattr__(self, "bad_words_token_ids", seqs)

    def resolved(self, defaults: dict | None = None, seed: int | None = None) -> SamplingParams:
        """These params with every unset field filled: from `defaults` (a checkpoint's
        generation config), else `NEUTRAL`; an unset seed becomes `seed`. Always a frozen
        `SamplingParams` (a request keeps it whatever its script changes afterwards)."""
        if type(self) is not SamplingParams:
            self = SamplingParams(**{f.name: getattr(self, f.name) for f in FIELDS})
        fill = {}
        for name, neutral in NEUTRAL.items():
            if getattr(self, name) is None:
                fill[name] = (defaults or {}).get(name, neutral)
        if self.seed is None and seed is not None:
            fill["seed"] = seed
        return dataclasses.replace(self, **fill) if fill else self

    @property
    def penalized(self) -> bool:
        """Whether a penalty needs the request's token counts on the device."""
        return (
            self.repetition_penalty not in (None, 1.0)
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    @property
    def samples(self) -> int:
        """How many samples are drawn: best_of, else n."""
        return self.best_of or self.n

    def token_ids(self) -> list[int]:
        """Every token id the request names (bias, allowed, bad words): each must be inside
        the vocabulary."""
        ids = list(self.logit_bias or ()) + list(self.allowed_token_ids or ())
        return ids + [t for w in self.bad_words_token_ids for t in w]

    def sample_seed(self, i: int) -> int:
        """The seed of the i-th of `n` samples: the request's own for the first, a distinct
        mix of (seed, i) for the others (the seed must be set: `resolved`)."""
        if i == 0:
            return self.seed
        mixed = (self.seed * 0x9E3779B1 + i * 0x85EBCA77) & 0xFFFFFFFF
        return mixed ^ (mixed >> 15)


def _stop_ids(stops) -> tuple[int, ...]:
    return _token_ids("stop_token_ids", stops)


def _token_ids(name: str, ids) -> tuple[int, ...]:
    if isinstance(ids, str | bytes) or not hasattr(ids, "__iter__"):
        raise RequestError(f"{name} must be token ids, got {ids!r}")
    ids = tuple(ids)
    bad = [t for t in ids if not _is_int(t)]
    bad += [t for t in ids if not bad and not 0 <= t <= INT32_MAX]
    if bad:
        raise RequestError(f"{name} must be integers in [0, 2**31), got {bad[0]!r}")
    return tuple(int(t) for t in ids)


def _logit_bias(bias) -> dict[int, float] | None:
    if bias is None:
        return None
    if not hasattr(bias, "items"):
        raise RequestError(f"logit_bias must map token ids to biases, got {bias!r:.60}")
    out = {}
    for token, value in bias.items():
        if isinstance(token, str) and token.strip().lstrip("-").isdigit():
            token = int(token)  # JSON object keys are strings
        (token,) = _token_ids("logit_bias", (token,))
        if not _is_number(value) or math.isnan(value) or abs(value) > FLOAT32_MAX:
            raise RequestError(f"logit_bias[{token}] must be a number, got {value!r}")
        out[token] = float(value)
    return out


def _stop_strings(stop, name: str = "stop") -> tuple[str, ...]:
    stop = (stop,) if isinstance(stop, str) else stop
    if not hasattr(stop, "__iter__"):
        raise RequestError(f"{name} must be a string or strings, got {stop!r}")
    stop = tuple(stop)
    bad = [s for s in stop if not isinstance(s, str) or not s]
    if bad:
        raise RequestError(f"{name} strings must be non-empty strings, got {bad[0]!r}")
    return stop


FIELDS = dataclasses.fields(SamplingParams)


class EditableSamplingParams(SamplingParams):
    """`SamplingParams` a script may change field by field, as vLLM's are
    (`params = llm.get_default_sampling_params(); params.max_tokens = 64`): each assignment is
    checked as the constructor checks (a bad value is a RequestError and changes nothing), and
    a request takes a frozen copy when it is added."""

    __hash__ = None  # mutable

    def __setattr__(self, name: str, value) -> None:
        names = [f.name for f in FIELDS]
        if name not in names:
            raise AttributeError(f"SamplingParams has no field {name!r}")
        checked = SamplingParams(
            **{n: getattr(self, n) for n in names if n != name}, **{name: value}
        )
        for n in names:
            object.__setattr__(self, n, getattr(checked, n))
