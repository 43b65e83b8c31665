"""What SGLang's and vLLM's launch flags mean here: every flag of SGLang's `launch_server` and
of `vllm serve` (foreign_flags.json, read from the two projects' own parsers by
tools/make_launch_flags.py), with swajax's answer to each: honoured under swajax's name,
refused with the reason where running without it would give the user something else than
what the flag asks for (a LoRA adapter, a tool-call parser, TLS, several pipeline stages), or
accepted with a line saying it has no effect here and why. The command line (`cli/launch_flags`)
and `LLM(...)`'s keyword settings both answer from here. Host code."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

TABLE = Path(__file__).with_name("foreign_flags.json")

# Flags honoured under another swajax name (given as aliases in the commands' own parsers,
# which therefore never reach the table's handling): listed here for docs/launch-flags.md.
ALIASES = {
    "--model-path": "--model",
    "--tp": "--tp-size",
    "-tp": "--tp-size",
    "--tensor-parallel-size": "--tp-size",
    "--max-num-seqs": "--max-running-requests",
    "--max-num-batched-tokens": "--chunked-prefill-size",
    "--block-size": "--page-size",
    "--max-model-len": "--context-length",
    "--gpu-memory-utilization": "--mem-fraction-static",
    "--random-seed": "--seed",
}

# Refused when given (a value of 1, where a count, is the single process this is).
REFUSED = {
    "--enable-lora": "swajax serves no LoRA adapters",
    "--lora-modules": "swajax serves no LoRA adapters",
    "--lora-paths": "swajax serves no LoRA adapters",
    "--enable-auto-tool-choice": "swajax returns the model's text; it parses no tool calls",
    "--tool-call-parser": "swajax returns the model's text; it parses no tool calls",
    "--reasoning-parser": "swajax returns the model's text; it separates no reasoning",
    "--tokenizer": "swajax reads the tokenizer in the model's own folder",
    "--tokenizer-path": "swajax reads the tokenizer in the model's own folder",
    "--disable-sliding-window": "the sliding windows are the model's attention; swajax keeps them",
    "--hf-overrides": "swajax reads the checkpoint's config as published",
    "--json-model-override-args": "swajax reads the checkpoint's config as published",
    "--ssl-keyfile": "swajax serves plain HTTP: put a TLS proxy in front of it",
    "--ssl-certfile": "swajax serves plain HTTP: put a TLS proxy in front of it",
    "--is-embedding": "swajax generates text; it serves no embeddings",
    "--load-format": "swajax reads safetensors checkpoints (or orbax)",
}
COUNTS = {  # a count above 1 refused: (why)
    "--pipeline-parallel-size": "swajax runs no pipeline stages",
    "-pp": "swajax runs no pipeline stages",
    "--pp-size": "swajax runs no pipeline stages",
    "--data-parallel-size": "one `swajax serve` is one replica: run several behind a balancer",
    "-dp": "one `swajax serve` is one replica: run several behind a balancer",
    "--dp-size": "one `swajax serve` is one replica: run several behind a balancer",
    "--dp": "one `swajax serve` is one replica: run several behind a balancer",
    "--nnodes": "`swajax serve` is one process (`swajax generate` joins several: --coordinator)",
}
LOAD_FORMATS = ("auto", "safetensors")

# No effect, and why: by the flag, then by words in its name, then by its group.
NO_EFFECT = {
    "--trust-remote-code": "swajax runs its own model code, never a checkpoint's",
    "--enable-metrics": "/metrics is always on",
    "--enable-chunked-prefill": "chunked prefill is always on (--chunked-prefill-size)",
    "--quantization": "swajax reads the quantization the checkpoint's config names "
    "(--dequantize-weights holds it dequantized)",
    "--device": "JAX chooses the platform (JAX_PLATFORMS)",
    "--max-prefill-tokens": "--chunked-prefill-size bounds a step's prompt tokens here",
    "--max-total-tokens": "the pools are sized by --kv-budget-gib or --mem-fraction-static",
    "--swap-space": "the pools are sized by --kv-budget-gib; --host-cache-gib keeps a host tier",
    "--disable-log-requests": "swajax does not log requests",
    "--enable-log-requests": "swajax does not log requests",
    "--log-requests": "swajax does not log requests",
    "--skip-tokenizer-init": "the tokenizer is read only where the folder has one",
    "--chat-template": "`swajax generate --chat` renders the checkpoint's template "
    "(`swajax serve --chat-template` takes another)",
}
BY_WORD = (
    (
        r"tokenizer",
        "swajax tokenizes with the `tokenizers` library from the model folder's tokenizer files",
    ),
    (
        r"cuda-graph|torch-compile|compilation|enforce-eager|^-O$|piecewise",
        "swajax compiles each step with XLA (Pallas kernels on GPU and TPU): there is no CUDA "
        "graph or torch.compile to configure",
    ),
    (
        r"backend|kernel|triton|flashinfer|cutlass|deep-?gemm|nccl|nvshmem|deepep|mooncake|aiter",
        "swajax's attention and matrix products are its own (XLA, Pallas: --attention); "
        "there is no kernel backend to choose",
    ),
    (
        r"disaggregation|kv-transfer|kv-events|pd-|prefill-only|decode-only|lmcache|hicache|"
        r"offload|flexkv|mooncake|kv-connector",
        "swajax's KV lives in its two pools and, with --host-cache-gib, a host tier; there is no "
        "external KV store or prefill/decode split",
    ),
    (
        r"expert|moe|^--ep|eplb|-ep-",
        "swajax runs every expert in one process, split by --tp-size",
    ),
    (
        r"(^-+|-)(log|logs|logging|trace|tracing|otlp|metrics?|profiler?|profiling|debug|crash|"
        r"dump|watchdog|stats)(-|$)",
        "swajax logs with -v / -q and always serves /metrics; it has no further tracing",
    ),
    (
        r"mm-|multimodal|image|video|audio|vision|processor|media",
        "swajax serves text: no multimodal inputs",
    ),
    (
        r"lora",
        "swajax serves no LoRA adapters (this one only tunes them)",
    ),
)
BY_GROUP = {
    "ParallelConfig": "swajax splits one model over --tp-size devices in one process",
    "CacheConfig": "swajax sizes its pools by --kv-budget-gib / --mem-fraction-static and its "
    "prefix cache by --cache-policy",
    "SchedulerConfig": "swajax's scheduler has its own policy (SGLang's: --cache-policy)",
    "Frontend": "a setting of vLLM's HTTP front end that swajax's server does not have",
    "ObservabilityConfig": "swajax always serves /metrics; it has no further tracing",
    "LoadConfig": "swajax reads safetensors checkpoints from a folder or the hub cache",
    "ModelConfig": "a model setting vLLM reads that swajax takes from the checkpoint",
}


@functools.cache
def table() -> dict:
    """{peer: {"version": str, "flags": [[spellings], arity, group]}}."""
    return json.loads(TABLE.read_text())


@functools.cache
def flags() -> dict[str, tuple[str, str, str, str]]:
    """Every spelling: (its canonical spelling, arity, group, peer)."""
    out = {}
    for peer, entry in table().items():
        for spellings, arity, group in entry["flags"]:
            for s in with_old(spellings, arity):
                out.setdefault(s, (spellings[0], arity, group, peer))
    return out


def with_old(spellings: list[str], arity: str) -> list[str]:
    """A switch's spellings, with vLLM's older off form (`--no-enable-x` beside today's
    `--disable-x`: launch lines written for earlier versions use it)."""
    first = spellings[0]
    if arity == "0" and first.startswith("--enable-") and "--no-" + first[2:] not in spellings:
        return [*spellings, "--no-" + first[2:]]
    return list(spellings)


@functools.cache
def by_canonical() -> dict[str, tuple[list[str], str, str]]:
    out: dict[str, tuple[list[str], str, str]] = {}
    for entry in table().values():
        for spellings, arity, group in entry["flags"]:
            spellings = with_old(spellings, arity)
            if spellings[0] not in out:
                out[spellings[0]] = (spellings, arity, group)
            else:  # both launchers have it: every spelling of either
                known = out[spellings[0]][0]
                known += [s for s in spellings if s not in known]
    return out


def negative(spelling: str) -> bool:
    return spelling.startswith("--no-") or (
        spelling.startswith("--disable-") and "--enable-" + spelling[10:] in flags()
    )


def why_no_effect(canonical: str) -> str:
    if canonical in NO_EFFECT:
        return NO_EFFECT[canonical]
    if canonical in REFUSED:  # its off form
        return "swajax has no such feature to turn off"
    for pattern, why in BY_WORD:
        if re.search(pattern, canonical):
            return why
    _, _, group, peer = flags()[canonical]
    name = {"sglang": "SGLang", "vllm": "vLLM"}[peer]
    return BY_GROUP.get(group, f"a setting of {name}'s runtime that swajax's engine does not have")


def disposition(spelling: str) -> str:
    """What swajax does with a flag, in a few words (docs/launch-flags.md)."""
    canonical, arity, group, _ = flags()[spelling]
    if spelling in ALIASES:
        return f"honoured: {ALIASES[spelling]}"
    if canonical in HONOURED:
        return f"honoured: {HONOURED[canonical]}"
    if canonical in REFUSED:
        if arity == "0" and any(negative(s) for s in flags() if flags()[s][0] == canonical):
            return f"refused: {REFUSED[canonical]} (its off form: no effect)"
        return f"refused: {REFUSED[canonical]}" + (
            " (auto and safetensors: no effect)" if canonical == "--load-format" else ""
        )
    if canonical in COUNTS:
        return f"1: no effect; more: refused ({COUNTS[canonical]})"
    return f"no effect: {why_no_effect(canonical)}"


HONOURED = {  # mapped in `_honoured` (the rest of the honoured ones are ALIASES)
    "--config": "a YAML file of flags (the line's own flags override it)",
    "--enable-prefix-caching": "on by default; the `--no-` form is --disable-radix-cache",
    "--enable-chunked-prefill": "always on; the `--no-` form takes whole prompts in a step",
    "--log-level": "swajax's log level (debug, info: -vv, -v; error: -q) and uvicorn's",
    "--uvicorn-log-level": "uvicorn's log level",
    "--log-level-http": "uvicorn's log level",
}
