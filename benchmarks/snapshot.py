"""Snapshot and restore of an engine: time and bytes against the pools, and the first turn a
restarted engine serves, warm against cold, and warm into pools half the size.

    python benchmarks/snapshot.py [--model tiny|DIR] [--kv-budget-gib 0.25]
        [--conversations 16] [--turn 512] [--json] [--smoke]

`--conversations` first turns of `--turn` random tokens each are served, the engine is saved
(`swajax.api.state.save_state`) and restored into a fresh engine built the same way; then every
conversation's second turn (its first turn plus 64 new tokens) is served by the restored engine
and by a cold one, and by an engine with half the KV budget restored from the same snapshot
(its prefix cache evicted by LRU to fit). Reports save and restore seconds, the snapshot's bytes
against the pools' bytes, the tokens the half-size restore dropped, and the second turns'
prompt tokens served from the cache: warm, warm at half size, cold.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from swajax.api import EngineSpec, load_model, make_engine
from swajax.api.state import restore_state, save_state
from swajax.serving.sampling_params import SamplingParams


def serve(engine, prompts) -> int:
    """Serve `prompts`; the prompt tokens the prefix cache supplied."""
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    engine.run()
    return sum(engine.requests[i].cached_tokens for i in ids)


def measure(model: str, budget: float, conversations: int, turn: int) -> dict:
    decoder, _ = load_model(model)
    spec = EngineSpec.of(kv_budget_gib=budget, max_running=8, max_context=turn + 128)
    rng = np.random.default_rng(0)
    vocab = decoder.spec.vocab_size
    first = [rng.integers(3, vocab, turn).tolist() for _ in range(conversations)]
    second = [p + rng.integers(3, vocab, 64).tolist() for p in first]
    engine = make_engine(decoder, spec)
    serve(engine, first)
    pool_bytes = sum(x.nbytes for x in jax.tree.leaves(engine.runner.pools))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "snap"
        t0 = time.perf_counter()
        save_state(engine, folder)
        saved = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        warm = make_engine(decoder, spec)
        t0 = time.perf_counter()
        restore_state(warm, folder)
        restored = time.perf_counter() - t0
        half = make_engine(decoder, spec.replace(kv_budget_gib=budget / 2))
        t0 = time.perf_counter()
        resized = restore_state(half, folder, requests=False)
        restored_half = time.perf_counter() - t0
    asked = sum(len(p) for p in second)
    return dict(
        pool_mib=pool_bytes / 2**20,
        snapshot_mib=size / 2**20,
        save_s=saved,
        restore_s=restored,
        second_turn_tokens=asked,
        restore_half_s=restored_half,
        half_dropped_tokens=resized["dropped_tokens"],
        half_kept_tokens=resized["tokens"],
        cached_warm=serve(warm, second),
        cached_half=serve(half, second),
        cached_cold=serve(make_engine(decoder, spec), second),
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--kv-budget-gib", type=float, default=0.25)
    p.add_argument("--conversations", type=int, default=16)
    p.add_argument("--turn", type=int, default=512)
    p.add_argument("--json", action="store_true")
    p.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = p.parse_args(argv)
    if args.smoke:
        args.kv_budget_gib, args.conversations, args.turn = 0.01, 2, 32
    r = measure(args.model, args.kv_budget_gib, args.conversations, args.turn)
    if args.json:
        print(json.dumps(r))
        return 0
    print(
        f"pools {r['pool_mib']:.1f} MiB, snapshot {r['snapshot_mib']:.1f} MiB; save "
        f"{r['save_s']:.2f} s, restore {r['restore_s']:.2f} s\n"
        f"half-size pools: restore {r['restore_half_s']:.2f} s, kept {r['half_kept_tokens']} "
        f"tokens, dropped {r['half_dropped_tokens']}\n"
        f"second turns: {r['cached_warm']} of {r['second_turn_tokens']} prompt tokens from the "
        f"cache restarted warm, {r['cached_half']} warm at half size, {r['cached_cold']} "
        "restarted cold"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
