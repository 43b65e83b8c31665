"""What deterministic mode (batch-invariant numerics) costs: default vs deterministic, same run.

    python benchmarks/deterministic.py [--model tiny|DIR] [--batch 1,16] [--prompt-len 256]
        [--new 64] [--repeats 3] [--json] [--smoke]

For each batch size and mode, on an engine compiled beforehand (one warm-up run): prefill
tokens per second (the prompts' tokens over the time to their first tokens) and decode tokens
per second (generated tokens over the rest), best of `--repeats` runs taken alternately, and the
ratio deterministic / default; and the share of requests whose greedy tokens are the same in both
modes (the modes add in different orders, so a near tie may break the other way). `--model`:
the embedded demo model, or a checkpoint folder (e.g. one written at published shapes by
benchmarks/published_shapes.py).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from swajax.api import EngineSpec, load_model, make_engine
from swajax.serving.sampling_params import SamplingParams


def engine(model: str, deterministic: bool, batch: int, prompt_len: int, new: int):
    decoder, _ = load_model(model)
    spec = EngineSpec.of(
        deterministic=deterministic,
        max_running=batch,
        max_context=prompt_len + new + 8,
        chunk_size=prompt_len * batch,
        kv_budget_gib=0.25,
    )
    return make_engine(decoder, spec)


def one_run(eng, prompts, new: int) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    ids = [eng.add_request(p, params) for p in prompts]
    t0 = time.perf_counter()
    first = None
    while not eng.idle:
        eng.step()
        if first is None and all(eng.requests[i].output for i in ids):
            first = time.perf_counter()
    end = time.perf_counter()
    prefill = sum(len(p) for p in prompts) / (first - t0)
    decode = len(prompts) * (new - 1) / (end - first)
    return dict(prefill=prefill, decode=decode, tokens=[eng.requests[i].output for i in ids])


def measure(model: str, batch: int, prompt_len: int, new: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    engines = {mode: engine(model, mode, batch, prompt_len, new) for mode in (False, True)}
    vocab = engines[False].model.vocab_size
    best = {mode: dict(prefill=0.0, decode=0.0) for mode in engines}
    tokens, same = {}, 0
    for r in range(repeats + 1):  # run 0 compiles; fresh random prompts: no prefix hits
        prompts = [rng.integers(3, vocab, prompt_len).tolist() for _ in range(batch)]
        for mode, eng in engines.items():
            got = one_run(eng, prompts, new)
            tokens[mode] = got.pop("tokens")
            if r:
                best[mode] = {k: max(best[mode][k], v) for k, v in got.items()}
        same += sum(a == b for a, b in zip(tokens[False], tokens[True], strict=True))
    row = dict(batch=batch, same_outputs=same / (batch * (repeats + 1)))
    for key in ("prefill", "decode"):
        row[f"{key}_default"] = best[False][key]
        row[f"{key}_deterministic"] = best[True][key]
        row[f"{key}_ratio"] = best[True][key] / best[False][key]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--batch", default="1,16")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = p.parse_args(argv)
    if args.smoke:
        args.batch, args.prompt_len, args.new, args.repeats = "2", 16, 4, 1
    rows = [
        measure(args.model, int(b), args.prompt_len, args.new, args.repeats)
        for b in args.batch.split(",")
    ]
    if args.json:
        print(json.dumps(rows))
        return 0
    print("batch  prefill tok/s default / deterministic (ratio)  decode tok/s (ratio)  same")
    for r in rows:
        print(
            f"{r['batch']:5d}  {r['prefill_default']:9.0f} / {r['prefill_deterministic']:9.0f} "
            f"({r['prefill_ratio']:.2f})  {r['decode_default']:8.1f} / "
            f"{r['decode_deterministic']:8.1f} ({r['decode_ratio']:.2f})  {r['same_outputs']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
