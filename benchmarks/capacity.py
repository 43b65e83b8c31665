"""Weights as loaded and the KV tokens what they leave buys, for the seed's published models.

    python benchmarks/capacity.py [--markdown]

For each preset: the parameters' device bytes as swajax loads the published checkpoint
(quantized weights kept: MXFP4 experts, block FP8) and dequantized to bfloat16, both counted
from the decoder's abstract parameters (`swajax.models.footprint`, the same numbers `swajax
generate --json` reports as weight_bytes). Then, on H100 80 GB and H200 141 GB with the fewest
chips whose memory (90% of it usable) holds the quantized weights and leaves at least a tenth
of itself to KV, the KV tokens (page size 16) that `swajax plan
--accelerator` finds room for: hybrid pools (ratio 0.8) against one pool, in bf16 and FP8 KV.
Pure arithmetic: no device is touched, nothing is timed.
"""

from __future__ import annotations

import argparse

from swajax.capacity import capacity_report
from swajax.models.footprint import config_footprint
from swajax.presets import hf_preset, load_preset
from swajax.simulator.step_time import ACCELERATORS

MODELS = (
    "gpt-oss-20b",
    "gpt-oss-120b",
    "mimo-v2-flash",
    "llama-4-scout",
    "gemma-3-27b",
    "gemma-4-31b",
    "step-3.5-flash",
)
USABLE = 0.9
KV_SHARE = 0.1  # the fewest chips that leave at least this share of their usable memory to KV


def rows():
    for name in MODELS:
        kept = config_footprint(hf_preset(name)).weight_bytes
        dequantized = config_footprint(hf_preset(name), dequantize_weights=True).weight_bytes
        cfg = load_preset(name)
        for device in ("h100", "h200"):
            acc = ACCELERATORS[device]
            chips = -int(-kept // (acc.memory_bytes * USABLE * (1 - KV_SHARE)))
            budget = int(chips * acc.memory_bytes * USABLE - kept)
            tokens = {}
            for kv in ("bf16", "fp8_e4m3"):
                report = capacity_report(cfg, budget, ratio=0.8, page_size=16, dtype=kv)
                tokens[kv] = (report.full_tokens, report.single_pool_tokens)
            yield name, kept, dequantized, acc.name, chips, budget, tokens


def main(argv=None) -> int | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--smoke", action="store_true", help="the same run (it is quick)")
    a = p.parse_args(argv)
    head = (
        "model",
        "weights as loaded GB",
        "dequantized GB",
        "device",
        "KV GB",
        "bf16 hybrid",
        "bf16 one pool",
        "FP8 hybrid",
        "FP8 one pool",
    )
    if a.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    for name, kept, deq, device, chips, budget, tokens in rows():
        cells = (
            name,
            f"{kept / 1e9:.1f}",
            f"{deq / 1e9:.1f}",
            f"{chips} x {device}",
            f"{budget / 1e9:.1f}",
            *(f"{n:,}" for kv in ("bf16", "fp8_e4m3") for n in tokens[kv]),
        )
        print("| " + " | ".join(cells) + " |" if a.markdown else "  ".join(cells))


if __name__ == "__main__":
    main()
