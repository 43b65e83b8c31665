"""`swajax generate` and `swajax logits`: parse, build through `swajax.api`, print."""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import numpy as np

from swajax.api import LLM, EngineSpec, load_model, make_engine, teacher_forced_logits
from swajax.api.engine_spec import KV_DTYPE, SPEC_OPTIONS, tensor_mesh
from swajax.cli import args as args_lib
from swajax.cli.cluster_args import add_cluster_args
from swajax.cluster import is_leader
from swajax.json_lines import read_json_lines
from swajax.serving.sampling_params import SamplingParams
from swajax.tokenizer import Tokenizer


def _prompt_ids(value, where: str) -> list[int]:
    ok = (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    )
    if not ok:
        raise ValueError(f"{where}: 'prompt_ids' must be a non-empty list of integers >= 0")
    return value


def read_prompts_file(path: str, tokenizer: Tokenizer) -> list[list[int]]:
    """JSON lines, one object per prompt: {"prompt": "text"} or {"prompt_ids": [1, 2, 3]}.

    Blank lines are skipped; anything else (another type, other keys, ids that are not
    non-negative integers, an empty file) is an error naming the line."""
    prompts = []
    for where, item in read_json_lines(path, "prompts file"):
        line = json.dumps(item)
        if not isinstance(item, dict) or len(item) != 1 or set(item) - PROMPT_KEYS:
            raise ValueError(
                f"{where}: each line must be an object with one key, 'prompt' or "
                f"'prompt_ids', got {line.strip()[:60]!r}"
            )
        if "prompt_ids" in item:
            prompts.append(_prompt_ids(item["prompt_ids"], where))
        elif isinstance(item["prompt"], str) and item["prompt"]:
            prompts.append(tokenizer.encode(item["prompt"]))
        else:
            raise ValueError(f"{where}: 'prompt' must be a non-empty string")
    if not prompts:
        raise ValueError(f"the prompts file {path} holds no prompt")
    return prompts


PROMPT_KEYS = {"prompt", "prompt_ids"}


# ---------------------------------------------------------------------------------------------
# The commands


def _spec(args) -> EngineSpec:
    return EngineSpec.of(**engine_fields(args))


def engine_fields(args) -> dict:
    """The engine's settings from the flags: `EngineSpec` and `EngineOptions` fields."""
    return dict(
        kv_budget_gib=args.kv_budget_gib,
        mem_fraction=args.mem_fraction_static,
        chunk_size=args.chunked_prefill_size,
        max_context=args.context_length,
        max_running=args.max_running_requests,
        ratio=args.swa_full_tokens_ratio,
        page_size=args.page_size,
        hybrid_memory=not args.disable_hybrid_swa_memory,
        prefix_cache=not args.disable_radix_cache,
        cache_policy=args.cache_policy,
        tail_rebuild=args.tail_rebuild,
        num_speculative_tokens=_speculative_tokens(args),
        overlap=not getattr(args, "no_overlap", False),
        **({"decode_steps": args.decode_steps} if getattr(args, "decode_steps", None) else {}),
        attention=args.attention,
        deterministic=args.deterministic,
        scan_layers=not args.unroll_layers,
        tensor_parallel=args.tp_size,
        dtype=args.dtype,
        kv_dtype=args.kv_cache_dtype,
        host_cache_gib=args.host_cache_gib,
        max_logprobs=args.max_logprobs,
    )


# vLLM's and SGLang's spellings of the dtypes (`--dtype half`, `--kv-cache-dtype fp8`).
DTYPE_SPELLINGS = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}
KV_SPELLINGS = {
    "auto": None,
    "fp8": "fp8_e4m3",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
}


def spelled(spellings: dict):
    """An argparse type taking another project's spelling of a value as swajax's."""

    def parse(text: str):
        return spellings.get(text.lower(), text)

    return parse


def _speculative_tokens(args) -> int:
    """K (4 by default with a draft; `logits` has none)."""
    return speculative(args)[1]


# SGLang's --speculative-algorithm values and vLLM's --speculative-config methods that draft
# with the checkpoint's own multi-token-prediction layer when no draft model is named.
OWN_LAYER = {
    "mtp",
    "nextn",
    "eagle",
    "eagle3",
    "deepseek_mtp",
    "mimo_mtp",
    "ernie_mtp",
    "qwen3_next_mtp",
}


def speculative(args) -> tuple[str | None, int]:
    """(draft model, k) from swajax's flags (--draft-model, --num-speculative-tokens), SGLang's
    (--speculative-algorithm, --speculative-draft-model-path, --speculative-num-steps,
    --speculative-num-draft-tokens) or vLLM's (--speculative-config JSON: method, model,
    num_speculative_tokens); (None, 0) without a draft."""
    draft, k = getattr(args, "draft_model", None), getattr(args, "num_speculative_tokens", None)
    algorithm = getattr(args, "speculative_algorithm", None)
    config = getattr(args, "speculative_config", None)
    if config is not None:
        try:
            config = json.loads(config)
        except json.JSONDecodeError as e:
            raise args_lib.UsageError(f"--speculative-config: not JSON ({e})") from None
        if not isinstance(config, dict):
            raise args_lib.UsageError("--speculative-config: give a JSON object")
        unknown = set(config) - {"method", "model", "num_speculative_tokens"}
        if unknown:
            raise args_lib.UsageError(
                f"--speculative-config: swajax takes method, model and num_speculative_tokens; "
                f"got {sorted(unknown)}"
            )
        draft = config.get("model", draft)
        algorithm = config.get("method", algorithm)
        k = config.get("num_speculative_tokens", k)
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 64):
            raise args_lib.UsageError(
                f"--speculative-config: num_speculative_tokens must be an integer in [1, 64], "
                f"got {k!r}"
            )
    if draft is None and algorithm is not None:
        if str(algorithm).lower() not in OWN_LAYER:
            raise args_lib.UsageError(
                f"speculative algorithm {algorithm!r} needs a draft model "
                "(--speculative-draft-model-path, or 'model' in --speculative-config); without "
                f"one swajax drafts with the checkpoint's own layer: {', '.join(sorted(OWN_LAYER))}"
            )
        draft = "mtp"
    steps_plus_one = getattr(args, "speculative_num_draft_tokens", None)
    if k is None and steps_plus_one is not None:
        k = steps_plus_one - 1  # SGLang's draft tokens per chain: the steps and the root
    if draft is None:
        if k is not None:
            raise args_lib.UsageError(
                "--num-speculative-tokens (--speculative-num-steps) needs a draft: "
                "--draft-model, --speculative-algorithm or --speculative-config"
            )
        return None, 0
    return draft, 4 if k is None else k


def _prompts(args, tokenizer: Tokenizer) -> list[list[int]]:
    given = [x is not None for x in (args.prompt, args.prompt_ids, args.prompts_file)]
    if sum(given) > 1:
        raise args_lib.UsageError("give one of --prompt, --prompt-ids, --prompts-file")
    if args.prompts_file:
        return read_prompts_file(args.prompts_file, tokenizer)
    if args.prompt_ids:
        return [args.prompt_ids]
    if args.prompt == "":
        raise args_lib.UsageError("--prompt is empty")
    return [tokenizer.encode(args.prompt if args.prompt is not None else "Sliding windows")]


def _finite(values: list[float]) -> list[float | None]:
    """JSON has no NaN: a non-finite logprob is written as null (and reported on stderr)."""
    out = [v if math.isfinite(v) else None for v in values]
    if None in out:
        print("swajax generate: warning: non-finite logprobs written as null", file=sys.stderr)
    return out


def run_generate(args) -> int:
    llm = LLM.from_spec(
        args.model,
        _spec(args),
        revision=args.revision,
        generation_config=args.generation_config,
        draft_model=speculative(args)[0],
        dequantize_weights=args.dequantize_weights,
        flags=("--model", "--draft-model"),
    )
    prompts = _prompts(args, llm.tokenizer)
    given = dict(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
    )
    params = SamplingParams(
        max_tokens=args.max_tokens,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
        stop=tuple(args.stop or ()),
        n=args.n,
        logprobs=args.logprobs,
        ignore_eos=args.ignore_eos,
        **{k: v for k, v in given.items() if v is not None},  # unset: the checkpoint's own
    )
    if params.temperature is None and "temperature" not in llm.engine.sampling_defaults:
        params = dataclasses.replace(params, temperature=0.0)  # the command's own default
    if args.chat:
        conversations = [[{"role": "user", "content": llm.tokenizer.decode(p)}] for p in prompts]
        results = llm.chat(conversations, params)
    else:
        results = llm.generate(prompts, params)
    outputs = [(i, r, o) for i, r in enumerate(results) for o in r.outputs]
    summary = llm.summary()
    if args.json:
        for _, result, out in outputs:
            line = dict(
                prompt_ids=result.prompt_token_ids,
                tokens=out.token_ids,
                logprobs=_finite(out.token_logprobs),
                text=out.text,
                finish_reason=out.finish_reason,
                stop_reason=out.stop_reason,
                cached_tokens=result.num_cached_tokens,
                sample=out.index,
            )
            if out.logprobs is not None:  # JSON keys are strings: [[id, logprob], ...]
                line["top_logprobs"] = [_top(top, args.logprobs) for top in out.logprobs]
            print(json.dumps(line, allow_nan=False))
        print(json.dumps(dict(summary=summary), allow_nan=False))
    else:
        for i, result, out in outputs:
            _print_output(i, result, out, len(prompts), args.n, args.show_ids)
        print(
            f"memory: peak full {summary['peak_full_used']}/{summary['full_tokens']} tokens, "
            f"peak SWA {summary['peak_swa_used']}/{summary['swa_tokens']}, prefix hits "
            f"{summary['prefix_hit_tokens']}, SWA KV freed {summary['swa_freed_tokens']} tokens"
        )
        if summary["draft_tokens_proposed"]:
            rounds = sum(summary["acceptance_lengths"].values())
            print(
                f"speculative: {summary['draft_tokens_accepted']} of "
                f"{summary['draft_tokens_proposed']} draft tokens kept over {rounds} request-"
                f"rounds; {summary['mean_acceptance_length']:.2f} tokens per round"
            )
    return 0 if all(o.finish_reason in ("length", "stop") for _, _, o in outputs) else 1


def _top(entry: dict, n: int) -> list:
    """The n likeliest of a position's {token: logprob} (vLLM's entry adds the sampled token
    where it is not among them), as [[id, logprob], ...] with null for a non-finite logprob."""
    ranked = sorted(entry.items(), key=lambda kv: -kv[1] if math.isfinite(kv[1]) else math.inf)
    return [[t, v if math.isfinite(v) else None] for t, v in ranked[:n]]


def _print_output(i: int, result, out, count: int, n: int, show_ids: bool) -> None:
    """The continuation as text first (ids when there is no tokenizer), then a labelled line."""
    if count > 1 or n > 1:
        sample = f", sample {out.index + 1} of {n}" if n > 1 else ""
        print(f"=== prompt {i + 1} of {count}{sample} ===")
    print(out.text if out.text is not None else f"token ids: {out.token_ids}")
    cached = result.num_cached_tokens
    cached = f", {cached} from the prefix cache" if cached and out.index == 0 else ""
    why = f" ({out.stop_reason})" if out.finish_reason == "abort" else ""
    print(
        f"[finish: {out.finish_reason}{why}; {len(out.token_ids)} tokens generated from "
        f"{len(result.prompt_token_ids)} prompt tokens{cached}]"
    )
    if show_ids and out.text is not None:
        print(f"token ids: {out.token_ids}")


def run_logits(args) -> int:
    """One prompt: FILE.npy holds its [len, vocab] logits. Several (--prompts-file): FILE.npz
    holds `logits_i` and `prompt_ids_i` for each, in the file's order."""
    decoder, tokenizer = load_model(
        args.model,
        args.dtype,
        args.chat,
        dequantize_weights=args.dequantize_weights,
        mesh=tensor_mesh(args.tp_size),
        revision=args.revision,
    )
    prompts = _prompts(args, tokenizer)
    if len(prompts) > 1 and not str(args.out).endswith(".npz"):
        raise args_lib.UsageError(
            f"{len(prompts)} prompts need --out FILE.npz (one array per prompt), got {args.out}"
        )
    engine = make_engine(decoder, _spec(args), consume=True)
    del decoder  # the engine holds the weights (restacked where layers are scanned)
    logits = [teacher_forced_logits(engine, prompt) for prompt in prompts]
    if not is_leader():  # joined processes: every one computed the logits, process 0 writes
        return 0
    with open(args.out, "wb") as f:  # np.save(path) would append .npy to another name
        if str(args.out).endswith(".npz"):
            arrays = {f"logits_{i}": x for i, x in enumerate(logits)}
            arrays.update({f"prompt_ids_{i}": np.asarray(p) for i, p in enumerate(prompts)})
            np.savez(f, **arrays)
        else:
            np.save(f, logits[0])
    shapes = ", ".join(str(x.shape) for x in logits[:3]) + (", ..." if len(logits) > 3 else "")
    print(f"wrote {args.out}: logits of {len(logits)} prompt(s) {shapes}")
    return 0


def add_model_args(p, prompts: bool = True) -> None:
    p.add_argument(
        "--model",
        "--model-path",
        default="tiny",
        help="'tiny' (embedded), a checkpoint folder, or a hub id in the local Hugging Face cache",
    )
    p.add_argument("--revision", help="with a hub id: a branch, tag or commit (default: main)")
    if prompts:
        p.add_argument("--prompt", help="text (needs the checkpoint's tokenizer.json)")
        p.add_argument("--prompt-ids", type=args_lib.token_ids, help="comma-separated ids")
        p.add_argument(
            "--prompts-file", help="JSON lines: {'prompt': text} or {'prompt_ids': [...]}"
        )
        chat = "wrap text prompts in the checkpoint's chat template (one user turn)"
        p.add_argument("--chat", action="store_true", help=chat)
    p.add_argument(
        "--attention",
        choices=("auto", "xla", "pallas"),
        default="auto",
        help="auto: the compiled Pallas kernels on GPU / TPU, the XLA path on CPU; pallas on CPU "
        "runs the kernels in Pallas' interpreter",
    )
    p.add_argument(
        "--deterministic",
        "--enable-deterministic-inference",
        action="store_true",
        help="batch-invariant numerics: a request's logits are the same bits whether its prefix "
        "came from a cold prefill, a prefix hit, a tail rebuild or the host tier, and whatever "
        "it is batched with (slower; the XLA attention path)",
    )
    p.add_argument(
        "--unroll-layers",
        action="store_true",
        help="trace every layer on its own instead of scanning repeating runs of "
        "layers (compile time then grows with depth)",
    )
    p.add_argument(
        "--dtype",
        type=spelled(DTYPE_SPELLINGS),
        choices=("auto", *KV_DTYPE),
        default="auto",
        help="parameters and activations (norms, softmax, routers stay float32); auto: the "
        "checkpoint's own (config.json's dtype / torch_dtype, else float32)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        type=spelled(KV_SPELLINGS),
        choices=(None, *KV_DTYPE.values(), "fp8_e4m3", "fp8_e5m2"),
        metavar="{auto,bf16,fp16,fp32,fp8,fp8_e4m3,fp8_e5m2}",
        help="KV pools (default, or auto: the same as --dtype); fp8_* (fp8: e4m3): one byte "
        "per value, scaled by the checkpoint's k_scale / v_scale where it has them",
    )
    p.add_argument(
        "--max-logprobs",
        type=args_lib.int_at_least(0, 1 << 16),
        default=SPEC_OPTIONS.max_logprobs,
        help="the most top-N logprobs a request may ask for",
    )
    p.add_argument(
        "--dequantize-weights",
        action="store_true",
        help="hold a quantized checkpoint's weights (MXFP4, block FP8) dequantized to "
        "--dtype instead of as published",
    )
    p.add_argument(
        "--kv-budget-gib",
        type=args_lib.BUDGET_GIB,
        help="KV pools' bytes (default: two contexts of the model's own length, "
        "at most 32,768 tokens each and 2 GiB in all)",
    )
    p.add_argument(
        "--mem-fraction-static",
        "--gpu-memory-utilization",
        dest="mem_fraction_static",
        type=args_lib.float_in(0.0, 1.0, lo_open=True),
        help="instead of --kv-budget-gib: the share of the device's memory (the host's on "
        "CPU) that weights and KV pools take together",
    )
    p.add_argument("--host-cache-gib", type=args_lib.HOST_GIB, default=0.0)
    p.add_argument(
        "--context-length",
        "--max-model-len",
        dest="context_length",
        type=args_lib.int_at_least(1, 1 << 24),
        help="longest prompt + new tokens of a request (default: the checkpoint's "
        "max_position_embeddings, capped by what the pools hold)",
    )
    p.add_argument(
        "--max-running-requests",
        "--max-num-seqs",
        type=args_lib.int_at_least(1, 4096),
        default=16,
        help="requests decoded together",
    )
    p.add_argument(
        "--swa-full-tokens-ratio",
        type=args_lib.RATIO,
        default=None,
        help="SWA / full, in (0, 1] (default 0.5; DeepSeek-V4: 0.1)",
    )
    p.add_argument(
        "--page-size",
        "--block-size",
        type=args_lib.PAGE_SIZE,
        default=None,
        help="tokens per KV page (default 4, 16 on Hopper GPUs; DeepSeek-V4: 64)",
    )
    p.add_argument(
        "--chunked-prefill-size",
        "--max-num-batched-tokens",
        type=args_lib.int_at_least(1, 1 << 20),
        default=SPEC_OPTIONS.chunk_size,
        help="prompt tokens computed per step and request (chunked prefill)",
    )
    p.add_argument(
        "--disable-hybrid-swa-memory",
        action="store_true",
        help="one pool for every layer (no SWA pool)",
    )
    p.add_argument(
        "--disable-radix-cache", action="store_true", help="share nothing between requests"
    )
    args_lib.add_cache_policy(p)
    p.add_argument("--no-compile-cache", action="store_true", help="compile everything afresh")
    p.add_argument(
        "--tp-size",
        "--tensor-parallel-size",
        "--tp",
        "-tp",
        dest="tp_size",
        type=args_lib.int_at_least(1, 1 << 16),
        metavar="N",
        help="split the model's KV heads and MLPs over N devices (default: 1; "
        "joined processes: all of their devices)",
    )
    if prompts:  # the batch commands; a server takes requests in one process
        add_cluster_args(p)


def add_decode_steps(p) -> None:
    p.add_argument(
        "--decode-steps",
        type=args_lib.int_at_least(1, 64),
        help="multi-step decode: up to this many decode steps in one program, "
        "read once (default 8 for a model; 1: off, for the lowest latency per "
        "streamed token)",
    )


def _add_sampling_args(p) -> None:
    """SamplingParams' fields (transformers' order: penalties, temperature, top-k, top-p, min-p)."""
    p.add_argument(
        "--temperature",
        type=args_lib.TEMPERATURE,
        default=None,
        help="0: greedy (the penalties still apply); default: the checkpoint's "
        "generation_config.json, else greedy",
    )
    unset = "default: the checkpoint's generation_config.json, else off"
    p.add_argument("--top-k", type=args_lib.int_at_least(0), help=f"0: off; {unset}")
    p.add_argument("--top-p", type=args_lib.TOP_P, help=unset)
    p.add_argument("--min-p", type=args_lib.float_in(0.0, 1.0), help=f"0: off; {unset}")
    p.add_argument(
        "--repetition-penalty",
        type=args_lib.float_in(0.0, 1e4, lo_open=True),
        help=f"transformers': prompt and output tokens; 1: off; {unset}",
    )
    p.add_argument(
        "--generation-config",
        choices=("auto", "vllm"),
        default="auto",
        help="auto: sampling defaults from the checkpoint's generation_config.json; vllm: "
        "ignore it",
    )
    for name in ("presence", "frequency"):
        p.add_argument(
            f"--{name}-penalty",
            type=args_lib.float_in(-1e4, 1e4),
            default=0.0,
            help="OpenAI's, over output tokens; 0: off",
        )
    p.add_argument(
        "--stop",
        action="append",
        metavar="TEXT",
        help="stop when the text holds TEXT (not returned); may repeat",
    )
    p.add_argument(
        "--n",
        type=args_lib.int_at_least(1, 1024),
        default=1,
        help="samples per prompt (they share the prompt's prefill)",
    )
    p.add_argument(
        "--logprobs",
        type=args_lib.int_at_least(0, 20),
        default=0,
        help="with --json: the N likeliest tokens' logprobs per position",
    )
    p.add_argument("--seed", "--random-seed", type=args_lib.SEED, default=0)


def add_speculative(p) -> None:
    g = p.add_argument_group("speculative decoding")
    g.add_argument(
        "--draft-model",
        "--speculative-draft-model-path",
        help="'tiny', a checkpoint folder with the target's vocabulary, or 'mtp' (the "
        "checkpoint's own multi-token-prediction layer: MiMo-V2-Flash, Step 3.x, DeepSeek-V4); "
        "rejection sampling keeps the target's distribution, every sampling field included",
    )
    g.add_argument(
        "--num-speculative-tokens",
        "--speculative-num-steps",
        type=args_lib.int_at_least(1, 64),
        help="draft tokens per decode step (default 4 with a draft)",
    )
    g.add_argument(
        "--speculative-num-draft-tokens",
        type=args_lib.int_at_least(2, 65),
        help="SGLang's: the draft tokens of a chain counting its root (k + 1)",
    )
    g.add_argument(
        "--speculative-algorithm",
        type=str.lower,
        help="SGLang's: MTP, NEXTN or EAGLE draft with the checkpoint's own layer unless "
        "--speculative-draft-model-path names a model",
    )
    g.add_argument(
        "--speculative-config",
        metavar="JSON",
        help='vLLM\'s: {"method": "mtp", "num_speculative_tokens": 2} or {"model": PATH, ...}',
    )


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate tokens through the engine")
    add_model_args(p)
    p.add_argument("--max-tokens", type=args_lib.int_at_least(1, 1 << 20), default=32)
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="do not stop at the checkpoint's eos_token_id (generation_config.json, "
        "else config.json)",
    )
    add_speculative(p)
    p.add_argument(
        "--no-overlap", action="store_true", help="read each step's result before planning the next"
    )
    add_decode_steps(p)
    _add_sampling_args(p)
    p.add_argument(
        "--json",
        action="store_true",
        help="JSON: an object per prompt (ids, logprobs, text), a summary",
    )
    p.add_argument(
        "--show-ids", action="store_true", help="also print the generated token ids after the text"
    )
    p.set_defaults(func=run_generate)
    p = sub.add_parser("logits", help="teacher-forced logits of a prompt, through the engine")
    add_model_args(p)
    p.add_argument(
        "--out",
        type=args_lib.out_file(".npy", ".npz"),
        required=True,
        help="FILE.npy (one prompt) or FILE.npz (logits_i, prompt_ids_i)",
    )
    p.set_defaults(func=run_logits)
