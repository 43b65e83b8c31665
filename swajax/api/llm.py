"""The public entry point for inference scripts, in the shape of vLLM's `LLM` and SGLang's
`Engine`: build once from a checkpoint folder (or the embedded demo), then `generate` a batch of
prompts or `stream` their tokens as steps finish. The engine stays reachable (`llm.engine`) for
those who drive it step by step."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from swajax.api.engine_spec import EngineSpec, load_model, make_engine, model_folder
from swajax.api.generation import summary
from swajax.errors import InputError
from swajax.generation_config import stop_token_ids
from swajax.serving.engine import Engine
from swajax.serving.request import Request, SamplingParams

Prompt = str | Sequence[int]


@dataclasses.dataclass(frozen=True)
class CompletionOutput:
    """One finished request."""

    index: int  # its place among the prompts given
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None  # None when the checkpoint has no tokenizer.json
    logprobs: list[float]  # of each generated token
    finish_reason: str  # "stop", "length", or "abort: <why>"
    cached_tokens: int  # prompt tokens the prefix cache supplied at its (last) admission


@dataclasses.dataclass(frozen=True)
class StreamEvent:
    """One generated token of one request, as its step finishes."""

    index: int  # the prompt's place
    token_id: int
    text: str | None  # the text this token adds (None without a tokenizer)
    finish_reason: str | None  # set on the request's last event


class LLM:
    """A model and an engine over it.

    `model`: "tiny" (the embedded demo) or a Hugging Face checkpoint folder; `dtype`:
    parameters and activations; `chat`: wrap text prompts in the checkpoint's chat template;
    `ignore_eos`: do not stop at the checkpoint's `eos_token_id`; `draft_model`: a speculative
    draft ("tiny" or a folder with the same vocabulary; set `num_speculative_tokens`, 4 by
    default); every other keyword is a
    field of `EngineSpec` or `EngineOptions` (`kv_budget_gib`, `max_context`, `max_running`,
    `page_size`, `ratio`, `prefix_cache`, `cache_policy`, ...)."""

    def __init__(
        self,
        model: str = "tiny",
        *,
        dtype: str = "float32",
        chat: bool = False,
        ignore_eos: bool = False,
        draft_model: str | None = None,
        **engine: object,
    ):
        decoder, self.tokenizer = load_model(model, dtype, chat)
        draft = None
        if draft_model is not None:
            draft = load_model(draft_model, dtype, flag="--draft-model")[0]
            engine.setdefault("num_speculative_tokens", 4)
        spec = EngineSpec.of(dtype=dtype, **engine)
        self.engine: Engine = make_engine(decoder, spec, draft)
        self.stop_token_ids = () if ignore_eos else stop_token_ids(model_folder(model))

    def generate(
        self, prompts: Prompt | Sequence[Prompt], sampling: SamplingParams | None = None
    ) -> list[CompletionOutput]:
        """Run every prompt (text or token ids) together; outputs in the prompts' order."""
        rids = self._add(prompts, sampling)
        self.engine.run()
        return [self._output(i, self.engine.requests[rid]) for i, rid in enumerate(rids)]

    def stream(
        self, prompts: Prompt | Sequence[Prompt], sampling: SamplingParams | None = None
    ) -> Iterator[StreamEvent]:
        """Every generated token of every prompt, as the step that made it finishes."""
        rids = self._add(prompts, sampling)
        seen = [0] * len(rids)
        texts = [""] * len(rids)
        while True:
            for i, rid in enumerate(rids):
                yield from self._new_events(i, self.engine.requests[rid], seen, texts)
            if all(self.engine.requests[r].done for r in rids):
                self.engine.flush()  # releases still queued reach the device
                return
            if self.engine.step() is None:  # the progress guarantee makes this unreachable
                raise RuntimeError("the engine went idle with requests unfinished")

    def summary(self) -> dict:
        """Memory over the engine's life so far (peaks, prefix hits, SWA KV freed, ...)."""
        return summary(self.engine)

    def _new_events(self, i: int, req: Request, seen: list[int], texts: list[str]):
        while seen[i] < len(req.output):
            token = req.output[seen[i]]
            seen[i] += 1
            last = seen[i] == len(req.output) and req.done
            text = self.tokenizer.decode(req.output[: seen[i]])
            delta = None if text is None else text[len(texts[i]) :]
            texts[i] = text or ""
            yield StreamEvent(i, token, delta, req.finish_reason if last else None)
        if req.done and not req.output and seen[i] == 0:
            seen[i] = -1  # an aborted request with no token: one event saying why
            yield StreamEvent(i, -1, None, req.finish_reason)

    def _add(self, prompts, sampling: SamplingParams | None) -> list[int]:
        batch = [prompts] if _single(prompts) else list(prompts)
        if not batch:
            raise InputError("prompts is empty: give a prompt or a list of prompts")
        params = sampling or SamplingParams()
        if self.stop_token_ids:
            stops = tuple(dict.fromkeys(params.stop_token_ids + self.stop_token_ids))
            params = dataclasses.replace(params, stop_token_ids=stops)
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in batch]
        return [self.engine.add_request(p, params) for p in ids]

    def _output(self, index: int, req: Request) -> CompletionOutput:
        return CompletionOutput(
            index=index,
            prompt_token_ids=list(req.prompt),
            token_ids=list(req.output),
            text=self.tokenizer.decode(req.output),
            logprobs=list(req.logprobs),
            finish_reason=req.finish_reason,
            cached_tokens=req.cached_tokens,
        )


def _single(prompts) -> bool:
    """One prompt (text, or a flat sequence of ids) rather than a list of prompts."""
    if isinstance(prompts, str):
        return True
    if not isinstance(prompts, Sequence) and not hasattr(prompts, "__array__"):
        raise InputError(f"prompts must be text, token ids or a list of them, got {prompts!r}")
    return len(prompts) > 0 and not hasattr(prompts[0], "__len__")
