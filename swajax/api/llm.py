"""The public entry point for inference scripts, in the shape of vLLM's `LLM` and SGLang's
`Engine`: build once from a checkpoint folder (or the embedded demo), then `generate` a batch of
prompts or `stream` their tokens as steps finish. The engine stays reachable (`llm.engine`) for
those who drive it step by step."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from swajax.api.engine_spec import (
    EngineSpec,
    load_model,
    make_engine,
    model_folder,
    tensor_mesh,
)
from swajax.api.generation import summary
from swajax.api.sample_stream import SampleStream, add_samples
from swajax.errors import InputError
from swajax.generation_config import stop_token_ids
from swajax.serving.engine import Engine
from swajax.serving.sampling_params import SamplingParams

Prompt = str | Sequence[int]


@dataclasses.dataclass(frozen=True)
class CompletionOutput:
    """One finished sample of one prompt."""

    index: int  # its prompt's place among the prompts given
    prompt_token_ids: list[int]
    token_ids: list[int]  # up to the one that completed a stop string, if one did
    text: str | None  # None when the checkpoint has no tokenizer.json; never the stop string
    logprobs: list[float]  # of each generated token (the model's raw distribution)
    finish_reason: str  # "stop", "length", or "abort: <why>"
    cached_tokens: int  # prompt tokens the prefix cache supplied at its (last) admission
    sample: int = 0  # which of the prompt's n samples (SamplingParams.n)
    top_logprobs: list[dict[int, float]] | None = None  # per token, if SamplingParams.logprobs


@dataclasses.dataclass(frozen=True)
class StreamEvent:
    """One generated token of one sample, as its step finishes."""

    index: int  # the prompt's place
    token_id: int
    text: str | None  # the text this event adds (None without a tokenizer)
    finish_reason: str | None  # set on the sample's last event
    sample: int = 0


class LLM:
    """A model and an engine over it.

    `model`: "tiny" (the embedded demo) or a Hugging Face checkpoint folder; `dtype`:
    parameters and activations; `chat`: wrap text prompts in the checkpoint's chat template;
    `ignore_eos`: do not stop at the checkpoint's `eos_token_id`; `dequantize_weights`: hold a
    quantized checkpoint's weights dequantized to `dtype`; `draft_model`: a speculative
    draft ("tiny" or a folder with the same vocabulary; set `num_speculative_tokens`, 4 by
    default); every other keyword is a
    field of `EngineSpec` or `EngineOptions` (`kv_budget_gib`, `max_context`, `max_running`,
    `page_size`, `ratio`, `prefix_cache`, `cache_policy`, `tensor_parallel`, ...)."""

    def __init__(
        self,
        model: str = "tiny",
        *,
        dtype: str = "float32",
        chat: bool = False,
        ignore_eos: bool = False,
        draft_model: str | None = None,
        dequantize_weights: bool = False,
        **engine: object,
    ):
        if draft_model is not None:
            engine.setdefault("num_speculative_tokens", 4)
        spec = EngineSpec.of(dtype=dtype, **engine)
        mesh = tensor_mesh(spec.tensor_parallel)
        decoder, self.tokenizer = load_model(
            model, dtype, chat, mesh=mesh, dequantize_weights=dequantize_weights
        )
        draft = None
        if draft_model is not None:
            draft = load_model(draft_model, dtype, flag="--draft-model", mesh=mesh)[0]
        self.engine: Engine = make_engine(decoder, spec, draft)
        self.stop_token_ids = () if ignore_eos else stop_token_ids(model_folder(model))
        self._lock = threading.Lock()  # one call at a time drives the engine
        self._holder: int | None = None  # the thread whose call holds it

    def generate(
        self, prompts: Prompt | Sequence[Prompt], sampling: SamplingParams | None = None
    ) -> list[CompletionOutput]:
        """Run every prompt (text or token ids) together; outputs in the prompts' order, the
        n samples of a prompt (`sampling.n`) one after another. Calls from several threads
        run one after another, each as if alone."""
        with self._call() as samples:
            self._add(prompts, sampling, samples)
            self._stop_strings(samples)
            while self._step(samples):
                self._stop_strings(samples)
            return [self._output(x) for x in samples]

    def stream(
        self, prompts: Prompt | Sequence[Prompt], sampling: SamplingParams | None = None
    ) -> Iterator[StreamEvent]:
        """Every generated token of every sample, as the step that made it finishes. The
        stream holds the LLM until it ends: a stream closed, dropped or left by an exception
        aborts its unfinished samples and returns their KV."""
        with self._call() as samples:
            self._add(prompts, sampling, samples)
            while True:
                self._stop_strings(samples)
                for x in samples:
                    yield from self._new_events(x)
                if not self._step(samples):
                    return

    @contextlib.contextmanager
    def _call(self):
        """One call's hold on the engine and its samples: whatever way the call ends (an
        error, an abandoned stream), its unfinished samples are aborted and the engine is
        left with nothing of it, ready for the next call."""
        me = threading.get_ident()
        if self._holder == me:
            raise InputError(
                "this LLM is already running a call in this thread (a stream not yet "
                "exhausted or closed?): finish or close() it first"
            )
        with self._lock:
            self._holder = me
            samples: list[SampleStream] = []
            try:
                yield samples
            finally:
                for x in samples:
                    if not self.engine.requests[x.rid].done:
                        self.engine.abort(x.rid, "abort: the caller stopped reading")
                self.engine.flush()
                self._holder = None

    def summary(self) -> dict:
        """Memory over the engine's life so far (peaks, prefix hits, SWA KV freed, ...)."""
        return summary(self.engine)

    def _stop_strings(self, samples: list[SampleStream]) -> None:
        """End the samples whose output now holds a stop string."""
        for x in samples:
            req = self.engine.requests[x.rid]
            if not req.done and x.watch.check(req.output):
                self.engine.stop(x.rid)

    def _step(self, samples: list[SampleStream]) -> bool:
        """One engine step unless every sample has ended (then False)."""
        if all(self.engine.requests[x.rid].done for x in samples):
            self.engine.flush()  # releases still queued reach the device
            return False
        if self.engine.step() is None:  # the progress guarantee makes this unreachable
            raise RuntimeError("the engine went idle with requests unfinished")
        return True

    def _new_events(self, x: SampleStream):
        req = self.engine.requests[x.rid]
        for e in x.new_events(req, self.tokenizer.decode):
            yield StreamEvent(x.index, e.token_id, e.text, e.finish_reason, x.sample)
        if req.done and not x.tokens(req) and x.seen == 0:
            x.seen = -1  # an aborted request with no token: one event saying why
            yield StreamEvent(x.index, -1, None, req.finish_reason, x.sample)

    def _add(self, prompts, sampling: SamplingParams | None, samples: list) -> None:
        """Queue every prompt's samples into `samples` (the ones queued before an error stay
        there, for the call to abort)."""
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise InputError(
                f"sampling must be a SamplingParams, got {type(sampling).__name__} (build one: "
                "SamplingParams(max_tokens=..., temperature=...))"
            )
        batch = [prompts] if _single(prompts) else list(prompts)
        if not batch:
            raise InputError("prompts is empty: give a prompt or a list of prompts")
        params = sampling or SamplingParams()
        if self.stop_token_ids:
            stops = tuple(dict.fromkeys(params.stop_token_ids + self.stop_token_ids))
            params = dataclasses.replace(params, stop_token_ids=stops)
        if params.stop and self.tokenizer.missing is not None:
            raise InputError(f"stop strings {params.stop!r} need the checkpoint's tokenizer.json")
        for i, p in enumerate(batch):
            if not isinstance(p, str) and (isinstance(p, bytes | bytearray) or not _ids(p)):
                raise InputError(
                    f"prompt {i} must be text (str) or token ids (ints), got "
                    f"{type(p).__name__}: {p!r:.60}"
                )
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in batch]
        for index, prompt in enumerate(ids):
            samples += add_samples(self.engine, prompt, params, index, self.tokenizer.decode)

    def _output(self, x: SampleStream) -> CompletionOutput:
        req = self.engine.requests[x.rid]
        out = x.tokens(req)
        return CompletionOutput(
            index=x.index,
            prompt_token_ids=list(req.prompt),
            token_ids=list(out),
            text=x.text(req, self.tokenizer.decode),
            logprobs=list(req.logprobs[: len(out)]),
            finish_reason=req.finish_reason,
            cached_tokens=req.cached_tokens,
            sample=x.sample,
            top_logprobs=list(req.top_logprobs[: len(out)]) if req.params.logprobs else None,
        )


def _ids(prompt) -> bool:
    """A sequence of token ids (ints; numpy's too; never bools)."""
    return hasattr(prompt, "__len__") and all(
        isinstance(t, int | np.integer) and not isinstance(t, bool) for t in prompt
    )


def _single(prompts) -> bool:
    """One prompt (text, or a flat sequence of ids) rather than a list of prompts."""
    if isinstance(prompts, str):
        return True
    if isinstance(prompts, bytes | bytearray):
        raise InputError(
            "prompts is bytes: give text (str), token ids (a list of ints) or a list of them"
        )
    if not isinstance(prompts, Sequence) and not hasattr(prompts, "__array__"):
        raise InputError(f"prompts must be text, token ids or a list of them, got {prompts!r}")
    return len(prompts) > 0 and not hasattr(prompts[0], "__len__")
