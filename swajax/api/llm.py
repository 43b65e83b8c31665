"""The public entry point for inference scripts, in the shape of vLLM's `LLM`: build once from a
checkpoint (a folder, a hub id in the local cache, or the embedded demo), then `generate` a
batch of prompts, `chat` with conversations, or `stream` tokens as steps finish. The engine
stays reachable (`llm.engine`) for those who drive it step by step.

Settings use vLLM's names where vLLM has the setting and SGLang's for the hybrid memory
(`RENAMED`); the engine's own fields (`EngineSpec`, `EngineOptions`) keep their names for
those who build engines directly."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from swajax import foreign_flags
from swajax.api.chat_messages import flattened, open_end
from swajax.api.engine_spec import EngineSpec, load_model, make_engine, tensor_mesh
from swajax.api.generation import summary
from swajax.api.hub import resolve_model
from swajax.api.logprob import Logprob, ranked
from swajax.api.metrics_reader import Metric, engine_metrics
from swajax.api.sample_stream import SampleStream, add_samples, best, prompt_logprobs
from swajax.api.script_tokenizer import ScriptTokenizer
from swajax.api.state import restore_state, save_state
from swajax.errors import InputError
from swajax.generation_config import sampling_defaults, stop_token_ids
from swajax.models.mtp import MTP, load_mtp
from swajax.progress_bar import progress
from swajax.serving.engine import Engine
from swajax.serving.sampling_params import EditableSamplingParams, SamplingParams
from swajax.tokenizer import ChatTemplate, missing_template, unreadable

Prompt = str | Sequence[int] | Mapping

# Public name -> the engine's field. vLLM's names where vLLM has the setting; SGLang's for what
# only the hybrid memory system has.
RENAMED = {
    "tensor_parallel_size": "tensor_parallel",
    "max_model_len": "max_context",
    "enable_prefix_caching": "prefix_cache",
    "gpu_memory_utilization": "mem_fraction",
    "kv_cache_dtype": "kv_dtype",
    "max_num_seqs": "max_running",
    "max_num_batched_tokens": "chunk_size",
    "block_size": "page_size",
    "swa_full_tokens_ratio": "ratio",
    "chunked_prefill_size": "chunk_size",
    "max_running_requests": "max_running",
    "enable_deterministic_inference": "deterministic",
}
# The engine's own fields a script may set under the same name (the rest are renamed above).
PASSED = (
    "seed",
    "page_size",
    "kv_budget_gib",
    "cache_policy",
    "attention",
    "deterministic",
    "scan_layers",
    "host_cache_gib",
    "decode_steps",
    "overlap",
    "tail_rebuild",
    "eviction_interval",
    "max_logprobs",
    "num_speculative_tokens",
    "warmup",
)
OWN = (
    "dtype",
    "revision",
    "draft_model",
    "dequantize_weights",
    "generation_config",
    "restore_from",
)
INVERTED = ("disable_hybrid_swa_memory",)  # its engine field is the opposite: hybrid_memory


def engine_settings(settings: Mapping[str, object]) -> dict:
    """`EngineSpec` fields from `LLM`'s keyword settings; an unknown or old name is an error
    naming it and the valid ones."""
    fields = {}
    for name, value in settings.items():
        if name in RENAMED:
            if name == "kv_cache_dtype":
                value = {"auto": None, "fp8": "fp8_e4m3"}.get(value, value)
            fields[RENAMED[name]] = value
        elif name == "disable_hybrid_swa_memory":
            fields["hybrid_memory"] = not value
        elif name in PASSED:
            fields[name] = value
        elif _foreign(name, value):
            continue  # one of vLLM's or SGLang's settings that has no effect here (warned)
        else:
            old = {v: k for k, v in RENAMED.items()} | {"hybrid_memory": INVERTED[0]}
            hint = f" (renamed: {old[name]})" if name in old else ""
            valid = ", ".join(sorted((*RENAMED, *INVERTED, *PASSED, *OWN)))
            raise InputError(f"LLM() got an unknown setting {name!r}{hint}; valid: {valid}")
    return fields


@dataclasses.dataclass(frozen=True)
class CompletionOutput:
    """One sample of one prompt (vLLM's `CompletionOutput`)."""

    index: int  # which of the prompt's n samples
    text: str | None  # None when the checkpoint has no tokenizer; never the stop string
    token_ids: list[int]  # up to the one that completed a stop string, if one did
    cumulative_logprob: float  # sum of `token_logprobs`
    # Per generated token, {token: Logprob} of the sampled one and the N likeliest (vLLM's
    # objects, which are floats too: swajax.api.logprob), when SamplingParams.logprobs = N > 0;
    # else None.
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str  # "stop", "length" or "abort"
    # What stopped it: a stop string, or one of the request's own stop_token_ids (None for the
    # checkpoint's eos and for "length"); for "abort", why.
    stop_reason: int | str | None
    token_logprobs: list[float]  # the logprob of each generated token (raw distribution)


@dataclasses.dataclass(frozen=True)
class RequestOutput:
    """One prompt's result (vLLM's `RequestOutput`): its n samples in `outputs`."""

    request_id: str
    prompt: str | None  # the text given (None for token ids)
    prompt_token_ids: list[int]
    # Per prompt position, {token: logprob} of the prompt's own token and the N likeliest
    # (None at position 0), when SamplingParams.prompt_logprobs = N; else None.
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int  # prompt tokens the prefix cache supplied (first sample)
    # Why the prefix cache supplied what it did (first sample; `MatchReport.as_dict()`: matched
    # and missed tokens, where the match stopped and why, what evicted the rest).
    prefix_cache: dict | None = None
    # Speculative decoding, over its samples: draft tokens proposed for it and accepted by the
    # verify rounds (0 without a draft).
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class StreamEvent:
    """One generated token of one sample, as its step finishes."""

    index: int  # the prompt's place
    token_id: int
    text: str | None  # the text this event adds (None without a tokenizer)
    finish_reason: str | None  # set on the sample's last event
    sample: int = 0


class LLM:
    """A model and an engine over it, with vLLM's settings.

    `model`: a checkpoint folder, a hub id found in the local Hugging Face cache (`revision`:
    a branch, tag or commit), or "tiny" (the embedded demo). `dtype`: parameters and
    activations. `seed`: where requests that set no seed draw theirs. `tensor_parallel_size`,
    `max_model_len` (the longest prompt + output), `gpu_memory_utilization` (the share of the
    device's memory, or the host's on CPU, that weights and KV pools may take),
    `enable_prefix_caching`, `kv_cache_dtype`; SGLang's `swa_full_tokens_ratio`,
    `disable_hybrid_swa_memory`, `page_size`, `chunked_prefill_size`, `max_running_requests`.
    `generation_config`: "auto" takes sampling defaults (temperature, top_p, top_k, min_p,
    repetition_penalty) from the checkpoint's generation_config.json for requests that leave
    them unset; "vllm" ignores it. `draft_model`: a speculative draft ("tiny" or a folder with
    the same vocabulary, or "mtp": the checkpoint's own multi-token-prediction layer, for
    MiMo-V2-Flash and Step 3.x; `num_speculative_tokens`, 4 by default). `dequantize_weights`:
    hold a quantized checkpoint dequantized. The engine's other fields pass through by name
    (`kv_budget_gib`, `cache_policy`, `host_cache_gib`, `decode_steps`, ...)."""

    def __init__(
        self,
        model: str = "tiny",
        *,
        dtype: str = "auto",
        revision: str | None = None,
        generation_config: str = "auto",
        draft_model: str | None = None,
        dequantize_weights: bool = False,
        restore_from: str | None = None,
        **settings: object,
    ):
        """`restore_from`: a folder `save_state` wrote, from an LLM built the same way: the
        prefix cache starts as it was saved (`swajax.api.state`)."""
        fields = engine_settings(settings)
        if draft_model is not None:
            fields.setdefault("num_speculative_tokens", 4)
        spec = EngineSpec.of(dtype=dtype, **fields)
        self._build(model, spec, revision, generation_config, draft_model, dequantize_weights)
        if restore_from is not None:
            restore_state(self.engine, restore_from, requests=False)

    @classmethod
    def from_spec(
        cls,
        model: str,
        spec: EngineSpec,
        *,
        revision: str | None = None,
        generation_config: str = "auto",
        draft_model: str | None = None,
        dequantize_weights: bool = False,
        flags: tuple[str, str] = ("model", "draft_model"),
    ) -> LLM:
        """An LLM from an `EngineSpec` (the engine's own field names), as the command line and
        tests build one; `flags` name the model and the draft in errors."""
        llm = cls.__new__(cls)
        llm._build(model, spec, revision, generation_config, draft_model, dequantize_weights, flags)
        return llm

    def _build(
        self,
        model,
        spec,
        revision,
        generation_config,
        draft_model,
        dequantize,
        flags=("model", "draft_model"),
    ) -> None:
        if generation_config not in ("auto", "vllm"):
            given = generation_config
            raise InputError(f"generation_config must be 'auto' or 'vllm', got {given!r}")
        self.model = model
        self.folder = resolve_model(model, revision, flags[0])
        mesh = tensor_mesh(spec.tensor_parallel)
        decoder, self.tokenizer = load_model(
            model,
            spec.dtype,
            mesh=mesh,
            dequantize_weights=dequantize,
            revision=revision,
            flag=flags[0],
        )
        draft = None
        if draft_model == MTP:  # the checkpoint's own draft layer, read beside the decoder
            draft = load_mtp(self.folder, decoder.spec, mesh=mesh)
        elif draft_model is not None:
            # the draft in the target's dtype: one set of activations, one KV dtype
            dtype = decoder.spec.dtype
            draft = load_model(draft_model, dtype, flag=flags[1], mesh=mesh)[0]
        # The LLM owns the decoder: its layers' arrays are freed as they are restacked.
        self.engine: Engine = make_engine(decoder, spec, draft, consume=True)
        del decoder, draft
        # Before the first request (`warmup=True`, serve's default): (step programs made
        # ready, of which compiled here, seconds).
        self.warmed_up: tuple[int, int, float] | None = None
        if spec.options.warmup:
            start = time.perf_counter()
            ready, compiled = self.engine.warm_up()
            self.warmed_up = (ready, compiled, time.perf_counter() - start)
        self.stop_token_ids = stop_token_ids(self.folder)
        if generation_config == "auto":
            self.engine.sampling_defaults = sampling_defaults(self.folder)
        self._template: ChatTemplate | None = None
        self._lock = threading.Lock()  # one call at a time drives the engine
        self._holder: int | None = None  # the thread whose call holds it
        self._ids = 0
        self._served: collections.Counter = collections.Counter()  # get_metrics' counts

    # ------------------------------------------------------------------------------------------
    # Calls

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Run every prompt (text, token ids, or vLLM's {"prompt": ...} /
        {"prompt_token_ids": ...}) together; one `RequestOutput` per prompt, in order.
        `sampling_params`: one for all, or one per prompt. Calls from several threads run one
        after another, each as if alone; `use_tqdm` shows a progress bar on a terminal."""
        batch = self._batch(prompts)
        texts = [p if isinstance(p, str) else None for p in batch]
        ids = [self._ids_of(p, i) for i, p in enumerate(batch)]
        return self._run(texts, ids, sampling_params, use_tqdm)

    def chat(
        self,
        messages: Sequence[Mapping] | Sequence[Sequence[Mapping]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        lora_request=None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
        chat_template_kwargs: Mapping | None = None,
        mm_processor_kwargs=None,
    ) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"} messages, content a string or a
        list of text parts) or a list of them, each rendered with the checkpoint's chat
        template (or `chat_template`, a template's text) and run as `generate` does. vLLM's
        keywords: `add_generation_prompt`, `continue_final_message` (the last message left
        open for the model to continue), `tools`, `chat_template_kwargs` (variables of the
        template, such as `enable_thinking` or `reasoning_effort`); `lora_request` and
        `mm_processor_kwargs` must be None (no adapters, text only)."""
        if lora_request is not None or mm_processor_kwargs is not None:
            which = "lora_request" if lora_request is not None else "mm_processor_kwargs"
            raise InputError(f"{which}: swajax serves no LoRA adapters and text only")
        if add_generation_prompt and continue_final_message:
            raise InputError("add_generation_prompt and continue_final_message: give one")
        conversations = _conversations(messages)
        template = self._chat_template(chat_template)
        variables = dict(chat_template_kwargs or {}, add_generation_prompt=add_generation_prompt)
        if tools is not None:
            variables["tools"] = tools
        texts = []
        for c in conversations:
            flat = flattened([dict(m) for m in c], chat_template_content_format)
            text = template.render_messages(flat, **variables)
            if continue_final_message:
                text = open_end(text, flat[-1])
            texts.append(text)
        ids = [self.tokenizer.encode_rendered(t) for t in texts]
        return self._run(texts, ids, sampling_params, use_tqdm)

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | None = None,
    ) -> Iterator[StreamEvent]:
        """Every generated token of every sample, as the step that made it finishes. The
        stream holds the LLM until it ends: a stream closed, dropped or left by an exception
        aborts its unfinished samples and returns their KV."""
        with self._call() as samples:
            ids = [self._ids_of(p, i) for i, p in enumerate(self._batch(prompts))]
            self._add(ids, [self._params(sampling_params, len(ids))[0]] * len(ids), samples)
            while True:
                self._stop_strings(samples)
                for x in samples:
                    yield from self._new_events(x)
                if not self._step(samples):
                    return

    def get_tokenizer(self) -> ScriptTokenizer:
        """The tokenizer as vLLM scripts call it (transformers' methods: encode, decode,
        apply_chat_template, the vocabulary); InputError where the checkpoint has no
        tokenizer.json."""
        return ScriptTokenizer(self.tokenizer, self._chat_template, self.stop_token_ids)

    def get_default_sampling_params(self) -> EditableSamplingParams:
        """vLLM's: SamplingParams with the checkpoint's generation config filled in (unless
        the LLM was made with generation_config="vllm"), which the script may change."""
        return EditableSamplingParams(**self.engine.sampling_defaults)

    def get_metrics(self) -> list[Metric]:
        """vLLM's metric objects under vLLM's names (`swajax.api.metrics_reader`)."""
        return engine_metrics(self.engine, dict(self._served), self.model)

    def summary(self) -> dict:
        """Memory over the engine's life so far (peaks, prefix hits, SWA KV freed, ...)."""
        return summary(self.engine)

    def save_state(self, folder: str, *, force: bool = False) -> None:
        """Save the engine, its prefix cache warm, for `LLM(..., restore_from=folder)`, which
        restores the cache (`swajax.api.state`; `force` replaces only a folder a save wrote)."""
        with self._call():
            save_state(self.engine, folder, force=force)

    # ------------------------------------------------------------------------------------------
    # Inside

    def _run(self, texts, ids, sampling_params, use_tqdm: bool) -> list[RequestOutput]:
        params = self._params(sampling_params, len(ids))
        with self._call() as samples:
            self._add(ids, params, samples)
            by_prompt: list[list[SampleStream]] = [[] for _ in ids]
            for x in samples:
                by_prompt[x.index].append(x)
            with progress(len(ids), "generating", shown=use_tqdm) as advance:
                left = [len(group) for group in by_prompt]  # unfinished samples per prompt
                running = list(samples)
                self._stop_strings(samples)
                while self._step(samples):
                    self._stop_strings(samples)
                    still = []
                    for x in running:  # each sample is looked at until it ends, then never
                        if not self.engine.requests[x.rid].done:
                            still.append(x)
                            continue
                        left[x.index] -= 1
                        if left[x.index] == 0:
                            advance()
                    running = still
            return [
                self._request_output(texts[i], by_prompt[i], params[i].n) for i in range(len(ids))
            ]

    def _params(self, sampling_params, count: int) -> list[SamplingParams]:
        if sampling_params is None:
            return [SamplingParams()] * count
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * count
        if isinstance(sampling_params, Sequence) and not isinstance(sampling_params, str):
            given = list(sampling_params)
            if len(given) != count or not all(isinstance(p, SamplingParams) for p in given):
                raise InputError(
                    f"sampling_params must be one SamplingParams or one per prompt ({count}), "
                    f"got {len(given)} item(s)"
                )
            return given
        raise InputError(
            f"sampling_params must be a SamplingParams, got {type(sampling_params).__name__} "
            "(build one: SamplingParams(max_tokens=..., temperature=...))"
        )

    def _batch(self, prompts) -> list:
        if isinstance(prompts, bytes | bytearray):
            raise InputError(
                "prompts is bytes: give text (str), token ids (a list of ints) or a list of them"
            )
        batch = [prompts] if _single(prompts) else list(prompts)
        if not batch:
            raise InputError("prompts is empty: give a prompt or a list of prompts")
        return batch

    def _ids_of(self, prompt, index: int) -> list[int]:
        if isinstance(prompt, Mapping):  # vLLM's TextPrompt / TokensPrompt
            if "prompt_token_ids" in prompt:
                prompt = prompt["prompt_token_ids"]
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise InputError(
                    f"a prompt dict needs 'prompt' or 'prompt_token_ids', got {prompt!r:.80}"
                )
        if isinstance(prompt, str):
            if self.tokenizer.missing is not None:
                raise InputError(unreadable(self.tokenizer.missing))
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, bytes | bytearray) or not _ids(prompt):
            raise InputError(
                f"prompt {index} must be text (str) or token ids (ints), got "
                f"{type(prompt).__name__}: {prompt!r:.60}"
            )
        return [int(t) for t in prompt]

    def _chat_template(self, source: str | None = None) -> ChatTemplate:
        """The checkpoint's chat template, or one given as text (with the checkpoint's
        special tokens)."""
        if source is not None:
            return ChatTemplate(self.folder, source=source)
        if self._template is None:
            try:
                self._template = ChatTemplate(self.folder)
            except ValueError as e:
                raise InputError(missing_template(self.folder, "use generate()")) from e
        return self._template

    @contextlib.contextmanager
    def _call(self):
        """One call's hold on the engine and its samples: whatever way the call ends (an
        error, an abandoned stream, a KeyboardInterrupt at any instant), its unfinished samples
        are aborted and the engine is left with nothing of it, ready for the next call (an
        interrupt inside a step rebuilds the engine: `Engine.recover`)."""
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
                try:
                    if self.engine.damaged:  # interrupted inside a step: rebuilt now
                        self.engine.recover()
                    for x in samples:
                        if not self.engine.requests[x.rid].done:
                            self.engine.abort(x.rid, "abort: the caller stopped reading")
                    self.engine.flush()
                finally:  # a second interrupt in the clean-up: the next call recovers
                    self._holder = None

    def _add(self, ids: list[list[int]], params: list[SamplingParams], samples: list) -> None:
        """Queue every prompt's samples into `samples` (the ones queued before an error stay
        there, for the call to abort)."""
        for i, (prompt, p) in enumerate(zip(ids, params)):
            if p.stop and self.tokenizer.missing is not None:
                raise InputError(f"stop strings {p.stop!r} need the checkpoint's tokenizer.json")
            if not p.ignore_eos and self.stop_token_ids:
                stops = tuple(dict.fromkeys(p.stop_token_ids + self.stop_token_ids))
                p = dataclasses.replace(p, stop_token_ids=stops)
            keep = p.prompt_logprobs is not None
            samples += add_samples(self.engine, prompt, p, i, self.tokenizer, keep_logits=keep)

    def _stop_strings(self, samples: list[SampleStream]) -> None:
        """End the samples whose output now holds a stop string."""
        for x in samples:
            req = self.engine.requests[x.rid]
            if not req.done and x.stopped(req):
                self.engine.stop(x.rid, keep=x.watch.cut[0])

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

    def _request_output(self, text, mine: list[SampleStream], n: int) -> RequestOutput:
        """`mine`: the prompt's samples (best_of of them: the n best are returned)."""
        drawn = [self.engine.requests[x.rid] for x in mine]
        first = drawn[0]
        mine = best(mine, drawn, n)
        reqs = [self.engine.requests[x.rid] for x in mine]
        prompt_lps = None
        if first.params.prompt_logprobs is not None:
            chosen, tops = prompt_logprobs(first, first.params.prompt_logprobs)
            decode = self.tokenizer.decode
            prompt_lps = [
                None if c is None else ranked(first.prompt[i], c, tops[i], decode)
                for i, c in enumerate(chosen)
            ]
        self._ids += 1
        self._served["prompt_tokens"] += len(first.prompt)
        self._served["cached_tokens"] += first.cached_tokens
        for req in reqs:
            self._served["generation_tokens"] += len(req.output)
            self._served[f"finished:{req.finish_reason or 'abort'}"] += 1
        return RequestOutput(
            request_id=str(self._ids - 1),
            prompt=text,
            prompt_token_ids=list(first.prompt),
            prompt_logprobs=prompt_lps,
            outputs=[self._completion(x, req, i) for i, (x, req) in enumerate(zip(mine, reqs))],
            finished=all(r.done for r in drawn),
            num_cached_tokens=first.cached_tokens,
            prefix_cache=first.cache_report.as_dict() if first.cache_report else None,
            num_draft_tokens=sum(r.spec_drafted for r in drawn),
            num_accepted_tokens=sum(r.spec_accepted for r in drawn),
        )

    def _completion(self, x: SampleStream, req, index: int) -> CompletionOutput:
        out = x.tokens(req)
        lps = [float(v) for v in req.logprobs[: len(out)]]
        tops = None
        if req.params.logprobs:
            decode = self.tokenizer.decode
            tops = [ranked(t, lp, top, decode) for t, lp, top in zip(out, lps, req.top_logprobs)]
        reason, stop = _finish(req, x, self.stop_token_ids)
        return CompletionOutput(
            index=index,
            text=x.text(req, self.tokenizer.decode),
            token_ids=list(out),
            cumulative_logprob=math.fsum(lps),
            logprobs=tops,
            finish_reason=reason,
            stop_reason=stop,
            token_logprobs=lps,
        )


def _finish(req, x: SampleStream, eos: tuple[int, ...]) -> tuple[str, int | str | None]:
    """vLLM's (finish_reason, stop_reason) of a finished request."""
    reason = req.finish_reason or ""
    if reason == "length":
        return "length", None
    if reason == "stop":
        if x.watch.matched is not None:
            return "stop", x.watch.matched
        last = req.output[-1] if req.output else None
        own = last is not None and last not in eos
        return "stop", last if own else None
    return "abort", reason.removeprefix("abort: ")


def _foreign(name: str, value) -> bool:
    """A keyword of vLLM's `LLM` (or SGLang's engine) that swajax knows but does not use: True
    after a warning saying why; an InputError where running without it would not be what it
    asks (swajax.foreign_flags); False for a name neither launcher has."""
    flag = "--" + name.replace("_", "-")
    known = foreign_flags.flags().get(flag)
    if known is None or value is None or value is False:
        return known is not None
    canonical = known[0]
    if canonical in foreign_flags.REFUSED:
        raise InputError(f"LLM(): {name}={value!r}: {foreign_flags.REFUSED[canonical]}")
    if canonical in foreign_flags.COUNTS:
        if not isinstance(value, int) or value > 1:
            raise InputError(f"LLM(): {name}={value!r}: {foreign_flags.COUNTS[canonical]}")
        return True
    why = foreign_flags.why_no_effect(canonical)
    warnings.warn(f"LLM(): {name}={value!r} has no effect here: {why}", stacklevel=4)
    return True


def _conversations(messages) -> list[list[Mapping]]:
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise InputError(
            "messages must be a conversation (a list of message dicts) or a list of them"
        )
    if all(isinstance(m, Mapping) for m in messages):
        return [list(messages)]
    if all(
        isinstance(c, Sequence) and c and all(isinstance(m, Mapping) for m in c) for c in messages
    ):
        return [list(c) for c in messages]
    raise InputError(
        "messages must be a conversation (a list of {'role', 'content'} dicts) or a list of them"
    )


def _ids(prompt) -> bool:
    """A sequence of token ids (ints; numpy's too; never bools)."""
    return hasattr(prompt, "__len__") and all(
        isinstance(t, int | np.integer) and not isinstance(t, bool) for t in prompt
    )


def _single(prompts) -> bool:
    """One prompt (text, a flat sequence of ids, a prompt dict) rather than a list of them."""
    if isinstance(prompts, str | Mapping):
        return True
    if not isinstance(prompts, Sequence) and not hasattr(prompts, "__array__"):
        raise InputError(f"prompts must be text, token ids or a list of them, got {prompts!r:.60}")
    return (
        len(prompts) > 0
        and not hasattr(prompts[0], "__len__")
        and not isinstance(prompts[0], Mapping)
    )
