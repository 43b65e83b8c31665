"""The device check: one command for a machine with a GPU or TPU, under 10 minutes.

    python benchmarks/device_check.py [--json] [--layers 4] [--new 32]
    python benchmarks/device_check.py --smoke     # anywhere: tiny shapes, Pallas interpreted

1. The decode kernel against its reference, compiled, and its achieved bandwidth against the
   device's peak (benchmarks/device_attention.py: batch 64, 32K tokens, bf16); on Hopper and
   newer both GPU front ends, Mosaic GPU (the engine's there) and Triton, side by side.
2. The engine on gpt-oss-20b's published widths (random weights in the hub's layout, written by
   benchmarks/published_shapes.py; `--layers` of its 24; the real 201,088-token vocabulary):
   the XLA path and the Pallas kernels must give the same greedy tokens.
3. Decode tokens / s at batch 1, 16 and 64 on the default path (the compiled kernels), and the
   device's peak memory against what the engine budgeted (weights + KV pools).

It checks itself (exit status 1 on a mismatch) and prints one line per figure, or one JSON
object with `--json`. `--smoke` runs the same steps at toy widths on CPU in interpret mode
(the default test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import device_attention  # noqa: E402
import published_shapes  # noqa: E402

from swajax.tpu import GENERATIONS  # noqa: E402

# Peak memory bandwidth by device kind (vendors' data sheets), bytes / s; the TPUs' from
# `swajax.tpu` (a v5p reports its kind as "TPU v5").
PEAK_BANDWIDTH = {
    "NVIDIA H200": 4.8e12,
    "NVIDIA H100 80GB HBM3": 3.35e12,
    "NVIDIA H100 PCIe": 2.0e12,
    "NVIDIA A100-SXM4-80GB": 2.04e12,
    "NVIDIA A100-SXM4-40GB": 1.56e12,
    **{g.device_kind: g.hbm_bytes_per_s for g in GENERATIONS.values()},
    "TPU v4": 1.2e12,
}
# Toy widths for --smoke (MXFP4 needs inputs in blocks of 32).
SMOKE = dict(
    hidden_size=64,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    experts_per_token=2,
    num_experts_per_tok=2,
    vocab_size=256,
    sliding_window=8,
)


def greedy(llm, prompts, new: int) -> list[list[int]]:
    from swajax import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def prompts_of(batch: int, vocab: int, length: int = 16) -> list[list[int]]:
    return [[(7 * i + 13 * j) % (vocab - 3) + 3 for j in range(length)] for i in range(batch)]


def decode_rate(llm, batch: int, vocab: int, new: int) -> float:
    """Tokens / s of `batch` requests decoding `new` tokens (prefill of 16 tokens each
    included, compiled beforehand)."""
    prompts = prompts_of(batch, vocab)
    greedy(llm, prompts, 2)
    t0 = time.perf_counter()
    greedy(llm, prompts, new)
    return batch * new / (time.perf_counter() - t0)


def device_memory() -> dict:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return {k: stats.get(k) for k in ("peak_bytes_in_use", "bytes_limit")}


def engine_check(folder: Path, smoke: bool, new: int, kv_gib: float) -> dict:
    import jax

    from swajax import LLM

    vocab = SMOKE["vocab_size"] if smoke else published_shapes.GPT_OSS_20B["vocab_size"]
    common = dict(kv_budget_gib=kv_gib, max_model_len=256)
    tokens, out = {}, {}
    for attention in ("xla", "pallas"):
        llm = LLM(str(folder), attention=attention, **common)
        tokens[attention] = greedy(llm, prompts_of(4, vocab), 8)
        del llm
    out["same_greedy_tokens"] = tokens["xla"] == tokens["pallas"]
    llm = LLM(str(folder), **common)  # the default: the compiled kernels on a device
    out["attention"] = llm.engine.model.implementation
    out["decode_tokens_per_s"] = {
        b: round(decode_rate(llm, b, vocab, new), 2) for b in ((1, 2) if smoke else (1, 16, 64))
    }
    summary = llm.summary()
    pools = llm.engine.runner.pools
    kv = sum(int(x.nbytes) for x in jax.tree.leaves(pools))
    out["budget_bytes"] = summary["weight_bytes"] + kv
    out["device_memory"] = device_memory()
    return out


def run(smoke: bool, layers: int, new: int) -> dict:
    import jax

    device = jax.devices()[0]
    result = dict(device=str(device), device_kind=device.device_kind, backend=jax.default_backend())
    kernel_args = ["--json"] + (["--smoke"] if smoke else [])
    kernels = _captured(device_attention.main, kernel_args)
    peak = PEAK_BANDWIDTH.get(device.device_kind)
    for kinds in kernels["front_ends"].values():
        for figures in kinds.values():
            gbs = figures["gb_per_s"]
            figures["share_of_peak"] = None if peak is None else round(gbs * 1e9 / peak, 3)
    result["decode_kernel"] = kernels
    config = dict(published_shapes.GPT_OSS_20B, **(SMOKE if smoke else {}))
    with tempfile.TemporaryDirectory(prefix="swajax_device_check_") as tmp:
        folder = Path(tmp) / "gpt-oss-20b"
        t0 = time.perf_counter()
        published_shapes.write_gpt_oss(config, folder, 2 if smoke else layers)
        result["written_s"] = round(time.perf_counter() - t0, 1)
        result["engine"] = engine_check(folder, smoke, 4 if smoke else new, 0.01 if smoke else 4.0)
    return result


def _captured(main, argv) -> dict:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        main(argv)
    return json.loads(buffer.getvalue())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--smoke", action="store_true", help="toy widths on CPU, Pallas interpreted")
    p.add_argument("--layers", type=int, default=4, help="of gpt-oss-20b's 24")
    p.add_argument("--new", type=int, default=32, help="tokens decoded per timed run")
    args = p.parse_args(argv)
    result = run(args.smoke, args.layers, args.new)
    engine = result["engine"]
    ok = engine["same_greedy_tokens"] and (args.smoke or engine["attention"] == "pallas")
    result["ok"] = ok
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['device']} ({result['device_kind']}, {result['backend']})")
        for front_end, kinds in result["decode_kernel"]["front_ends"].items():
            for kind, r in kinds.items():
                print(
                    f"  decode kernel ({front_end}) {kind:8} {r['ms']:.3f} ms, "
                    f"{r['gb_per_s']:.1f} GB/s ({r['share_of_peak']} of peak), "
                    f"rel err {r['rel_err']:.1e}"
                )
        print(
            f"  engine ({engine['attention']}): XLA and Pallas greedy tokens equal: "
            f"{engine['same_greedy_tokens']}"
        )
        for b, rate in engine["decode_tokens_per_s"].items():
            print(f"  decode batch {b}: {rate} tokens/s")
        print(f"  device memory {engine['device_memory']}, budget {engine['budget_bytes']} bytes")
        print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
