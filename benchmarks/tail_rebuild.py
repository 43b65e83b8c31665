"""Exact SWA-tail rebuild vs SGLang's fallback, measured with the null-model engine (`swajax
simulate`'s run) on a chat workload whose shared prefixes outlive their SWA KV.

    python benchmarks/tail_rebuild.py [--preset gpt-oss-120b] [--gib 16]
        [--swa-full-tokens-ratio 0.02]

The workload: `--documents` long documents (`--doc` tokens each); every document has
`--conversations` chats about it, `--turns` turns each (user turns of 32-256 tokens, replies of
64-512), the chats of all documents interleaved. A small SWA pool tombstones a document's SWA KV
between its chats while the full pool keeps its full KV, so a new chat's match is cut by the
window rule: the fallback recomputes from the last W live tokens (often the start), the rebuild
from n W tokens before the match's end.

Printed side by side, same workload and pools: prefill tokens computed, tokens the window rule
cut from matches, tokens rebuilt, tokens the rebuild saved, steps, and (with --accelerator) the
modeled seconds and output tokens per second (`simulator/step_time.py`).
"""

from __future__ import annotations

import argparse
import dataclasses

from swajax import sizing
from swajax.cli.args import model_cost
from swajax.presets import hf_preset, load_preset
from swajax.serving.options import EngineOptions
from swajax.simulator.run import run_workload
from swajax.simulator.step_time import ACCELERATORS, StepTimeModel
from swajax.simulator.workloads import document_chats


def main(argv=None) -> int | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt-oss-120b")
    ap.add_argument("--gib", type=float, default=16.0)
    ap.add_argument("--swa-full-tokens-ratio", type=float, default=0.02)
    ap.add_argument("--documents", type=int, default=4)
    ap.add_argument("--conversations", type=int, default=6)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--doc", type=int, default=8192)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--max-running-requests", type=int, default=8)
    ap.add_argument("--accelerator", default=None, help="e.g. h200: add modeled time")
    ap.add_argument("--cache-policy", default="lean")
    ap.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = ap.parse_args(argv)
    ratio = args.swa_full_tokens_ratio
    if args.smoke:
        args.documents, args.conversations, args.turns, args.doc, args.chunk = 1, 2, 2, 512, 512
        args.gib = 1.0
    cfg = load_preset(args.preset)
    budget = sizing.gib_to_bytes(args.gib)
    sizes = sizing.size_hybrid(
        cfg, budget, ratio=args.swa_full_tokens_ratio, page_size=16, dtype="bf16"
    )
    timer = None
    if args.accelerator:
        timer = StepTimeModel(
            cfg, model_cost(hf_preset(args.preset)), ACCELERATORS[args.accelerator]
        )
        timer = dataclasses.replace(timer, devices=timer.devices_needed(budget))
    print(
        f"{args.preset}, {args.gib} GiB, ratio {ratio}: full {sizes.full_tokens:,} / SWA "
        f"{sizes.swa_tokens:,} tokens; {args.documents} documents of {args.doc} tokens x "
        f"{args.conversations} chats x {args.turns} turns"
    )
    rows = {}
    for name, on in (("rebuild", True), ("fallback", False)):
        options = EngineOptions(
            max_running=args.max_running_requests,
            max_context=65_536,
            chunk_size=args.chunk,
            tail_rebuild=on,
            cache_policy=args.cache_policy,
        )
        workload = document_chats(args.documents, args.conversations, args.turns, args.doc)
        rows[name] = run_workload(
            cfg, sizes, workload, options=options, progress=False, timer=timer
        )
    keys = [
        "prefill_tokens",
        "swa_tail_miss_tokens",
        "rebuilt_tokens",
        "rebuild_saved_tokens",
        "prefix_hit_rate",
        "retractions",
        "steps",
        "finished",
        "lost",
    ]
    if timer is not None:
        keys += ["modeled_seconds", "tokens_per_s"]
    print(f"{'':24}{'rebuild':>14}{'fallback':>14}")
    for k in keys:
        a, b = getattr(rows["rebuild"], k), getattr(rows["fallback"], k)
        fmt = "{:>14.3f}" if isinstance(a, float) else "{:>14,}"
        print(f"{k:24}" + fmt.format(a) + fmt.format(b))
    a, b = rows["rebuild"].prefill_tokens, rows["fallback"].prefill_tokens
    print(f"prefill tokens computed: {a / b:.3f}x the fallback's ({1 - a / b:.1%} fewer)")


if __name__ == "__main__":
    main()
