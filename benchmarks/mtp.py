"""MTP drafting (the checkpoint's own draft layer) against plain decoding: the embedded demo
model, whose MTP layer tools/train_demo.py --mtp trained; then the same arithmetic modeled on an
H200 for MiMo-V2-Flash and DeepSeek-V4-Flash at their authors' published acceptance.

    python benchmarks/mtp.py [--requests 1] [--new 128] [--ks 1,2,3] [--sampling greedy|demo]

Measured (this machine, one run, side by side): greedy generation of held-out Python source
(tests/fixtures/demo_heldout.py.txt), compiled beforehand; per k, the tokens a round yields
(accepted drafts + 1), decode tokens per second, the speed-up over plain decoding and whether the
outputs equal plain decoding's (they must). `--sampling demo` samples with the demo's own
generation_config instead (temperature 0.6, top-p 0.9, repetition penalty 1.1; one seed per
request), as `swajax generate --draft-model mtp` does: outputs then differ from plain decoding's
draw by draw (the distributions are equal: tests/serving/test_speculative_fields.py). Plain
decoding is timed both in single steps and in the engine's default multi-step rounds.

Modeled: decode at batch 1 is bound by the bytes a step reads (HBM_BYTES_PER_S). A plain step
reads the active weights once per token; a round reads them once for k + 1 verified positions
(still bound by the weights at batch 1) plus the draft layer once per proposal, and yields the
published acceptance length. Speed-up = length / (1 + k * draft / active). An upper bound: it
leaves out the draft's attention, the verify's extra KV reads and every fixed cost.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from swajax import sizing
from swajax.api import engine_for
from swajax.demo import DEMO_DIR, demo_decoder
from swajax.models.decoder import HybridLM
from swajax.models.mtp import MtpLM, load_mtp
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams

HELD_OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "demo_heldout.py.txt"
HBM_BYTES_PER_S = 4.8e12  # H200 (NVIDIA's data sheet)
# name: (active parameters, draft-layer parameters, bytes per parameter, k, acceptance length,
# where the figures come from)
PUBLISHED = {
    "MiMo-V2-Flash": (
        15e9,
        0.33e9,
        1,  # FP8
        3,
        3.6,
        "15B active, 0.33B per MTP block; acceptance length up to 3.6 with 3 MTP layers "
        "(MiMo-V2-Flash technical report, 2026); its authors measured up to 2.6x",
    ),
    "DeepSeek-V4-Flash": (
        13e9,
        13e9 / 43,  # one decoder layer's share (43 layers)
        1,
        1,
        1 + 0.875,
        "13B active over 43 layers, one MTP layer; 85-90% acceptance of the second token "
        "(DeepSeek-V3 technical report, the same one-layer MTP; V4's authors publish none)",
    ),
}


def run(decoder, mtp, prompts, new: int, k: int, params: SamplingParams, steps: int = 1) -> dict:
    cfg = decoder.spec.hybrid
    model = HybridLM(decoder, dtype="fp32")
    draft = MtpLM(mtp, model) if k else None
    sizes = sizing.size_hybrid(
        cfg,
        sizing.gib_to_bytes(0.05),
        ratio=0.5,
        page_size=16,
        dtype="fp32",
        draft=mtp.spec.hybrid if k else None,
    )
    options = EngineOptions(
        max_running=len(prompts), max_context=2048, num_speculative_tokens=k, decode_steps=steps
    )
    engine = engine_for(cfg, model, sizes, options, draft=draft)
    params = dataclasses.replace(params, max_tokens=new)
    rids = [
        engine.add_request(p, dataclasses.replace(params, seed=params.seed and params.seed + i))
        for i, p in enumerate(prompts)
    ]
    t0 = time.perf_counter()
    engine.run()
    seconds = time.perf_counter() - t0
    rounds = sum(m.batch_size for m in engine.metrics if m.kind == "decode")
    outputs = [engine.requests[r].output for r in rids]
    tokens = sum(len(o) for o in outputs)
    return dict(
        # a target forward yields one token per request in plain decoding, multi-step or not
        per_round=(tokens - len(prompts)) / max(rounds, 1) if k else 1.0,
        tokens_per_s=tokens / seconds,
        outputs=outputs,
    )


def ks_of(args) -> list[int]:
    return [int(k) for k in args.ks.split(",")]


def modeled() -> None:
    print(f"\nModeled on an H200 at batch 1 ({HBM_BYTES_PER_S / 1e12:.1f} TB/s, weights only):")
    print(f"{'model':>18}{'k':>3}{'tokens/round':>14}{'plain tok/s':>13}{'MTP tok/s':>11}{'x':>7}")
    for name, (active, draft, b, k, length, source) in PUBLISHED.items():
        plain = HBM_BYTES_PER_S / (active * b)
        speedup = length / (1 + k * draft / active)
        print(
            f"{name:>18}{k:>3}{length:>14.2f}{plain:>13.0f}{plain * speedup:>11.0f}{speedup:>7.2f}"
        )
        print(f"{'':>18}   {source}")


def main(argv=None) -> int | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--ks", default="1,2,3")
    ap.add_argument("--sampling", choices=("greedy", "demo"), default="greedy")
    ap.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.prompt_len, args.new, args.ks = 32, 8, "2"
    # float32, as the other demo benchmarks (the demo checkpoint is bfloat16)
    decoder = demo_decoder(dtype="float32")
    mtp = load_mtp(DEMO_DIR, decoder.spec)
    text = HELD_OUT.read_bytes()
    step = len(text) // max(args.requests, 1)
    prompts = [list(text[i * step : i * step + args.prompt_len]) for i in range(args.requests)]
    if args.sampling == "demo":  # the demo's generation_config.json
        params = SamplingParams(temperature=0.6, top_p=0.9, repetition_penalty=1.1, seed=1)
    else:
        params = SamplingParams(temperature=0.0)
    # (label, k, decode steps per plain round)
    cases = [("plain", 0, 1), ("plain x8", 0, 8)] + [(str(k), int(k), 1) for k in ks_of(args)]
    for _, k, steps in cases:  # compile
        run(decoder, mtp, prompts, 8, k, params, steps)
    rows = {
        label: run(decoder, mtp, prompts, args.new, k, params, steps) for label, k, steps in cases
    }
    print(
        f"{args.requests} request(s) x {args.new} new tokens, demo model + its MTP layer, "
        f"{args.sampling} sampling"
    )
    print(f"{'k':>9}{'tokens/round':>14}{'tokens/s':>12}{'speed-up':>10}{'same outputs':>14}")
    for label, r in rows.items():
        same = r["outputs"] == rows["plain"]["outputs"]
        up = r["tokens_per_s"] / rows["plain"]["tokens_per_s"]
        print(f"{label:>9}{r['per_round']:>14.2f}{r['tokens_per_s']:>12.1f}{up:>10.2f}{same!s:>14}")
    modeled()


if __name__ == "__main__":
    main()
