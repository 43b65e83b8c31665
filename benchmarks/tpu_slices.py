"""The smallest TPU slice each published model compiles and fits on, per generation, compiled
here by the TPU compiler (no TPU): `swajax compile-check` over slice sizes.

    python benchmarks/tpu_slices.py [--models gpt-oss-20b,...] [--generations v5e,v6e,v5p]
                                    [--chips 1,4,8,16] [--context 32768] [--batch 64] [--markdown]
    python benchmarks/tpu_slices.py --render ROWS.jsonl   # the table of a saved run

For each model and generation it tries 1, 4, 8 and 16 chips and stops at the first where every
program compiles, its largest fits the chip's HBM, and the full pool holds one request of
`--context` tokens; it then asks whether one pool for every layer (hybrid memory off) would have
fitted the same slice. Bytes are compiled here (`memory_analysis`); seconds are XLA's TPU cost
model's bytes at the chip's bandwidth (modeled, never measured). One JSON line per model and
generation, or a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import time

MODELS = (
    "gpt-oss-20b",
    "gpt-oss-120b",
    "gemma-3-27b",
    "gemma-4-31b",
    "llama-4-scout",
    "mimo-v2-flash",
    "step-3.5-flash",
    "deepseek-v4-flash",
)
CHIPS = (1, 4, 8, 16)
GIB = 2**30


def attempt(model: str, slice_name: str, context: int, batch: int, hybrid: bool = True):
    """(report or None, why not)."""
    from swajax.api.compile_check import DoesNotFit, compile_check
    from swajax.presets import hf_preset

    try:
        report = compile_check(
            dict(hf_preset(model)),
            slice_name,
            name=model,
            max_context=context,
            batch=batch,
            hybrid_memory=hybrid,
        )
    except DoesNotFit as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - a refusal of any kind is a row of the table
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    if not report.fits:
        return None, f"peak {report.peak_bytes / GIB:.2f} GiB > {report.hbm_bytes / GIB:.0f}"
    if report.full_tokens < context:
        return None, f"full pool {report.full_tokens} tokens < one {context}-token context"
    return report, ""


def smallest(model: str, generation: str, context: int, batch: int, chips_tried=CHIPS) -> dict:
    from swajax import tpu

    gen = tpu.GENERATIONS[generation]
    tried = []
    for chips in chips_tried:
        name = f"{generation}-{chips * gen.cores_per_chip}"
        start = time.perf_counter()
        report, why = attempt(model, name, context, batch)
        tried.append({"slice": name, "seconds": round(time.perf_counter() - start, 1), "why": why})
        if report is None:
            continue
        row = {"model": model, "generation": generation, "slice": name, "chips": chips}
        row["tried"] = tried
        row["weights_gib"] = report.weight_bytes / GIB
        row["pools_gib"] = report.pool_bytes / GIB
        row["full_tokens"], row["swa_tokens"] = report.full_tokens, report.swa_tokens
        row["peak_gib"] = report.peak_bytes / GIB
        row["hbm_gib"] = report.hbm_bytes / GIB
        row["compile_s"] = sum(p.compile_seconds for p in report.programs)
        for p in report.programs:
            if p.name == "decode":
                row[f"decode_{p.rows}_ms"] = p.bandwidth_seconds * 1e3
        row["roofline_ms"] = report.roofline_seconds(1) * 1e3
        one, why_one = attempt(model, name, context, batch, hybrid=False)
        row["one_pool_fits"] = one is not None
        row["one_pool_why"] = why_one
        return row
    return {"model": model, "slice": None, "generation": generation, "tried": tried}


def _short(why: str) -> str:
    """A refusal in a few words: the figures that decided it."""
    if "not divisible" in why:
        return why.split("ValueError: ")[-1].replace(" of the mesh", "")
    if "weights take" in why:
        return "weights " + why.split("weights take ")[1].split(" a chip")[0] + " a chip"
    if "Ran out of memory" in why:
        return "temporaries: " + why.split("required for HLO temporaries ")[1].split(" exceeds")[0]
    return why[:80]


def markdown(rows: list[dict]) -> str:
    head = (
        "| model | smallest slice | weights / pools / peak a chip (GiB) | full + SWA tokens "
        "| decode x1 / x64, modeled (ms) | weights at bandwidth (ms) | one pool there? "
        "| compile here (s) |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        if r["slice"] is None:
            why = "; ".join(f"{t['slice']}: {_short(t['why'])}" for t in r["tried"][-2:])
            lines.append(f"| {r['model']} | none ({why}) | | | | | | |")
            continue
        lines.append(
            f"| {r['model']} | {r['slice']} | {r['weights_gib']:.2f} / {r['pools_gib']:.2f} / "
            f"{r['peak_gib']:.2f} of {r['hbm_gib']:.0f} | {r['full_tokens']:,} + "
            f"{r['swa_tokens']:,} | {r.get('decode_1_ms', 0):.2f} / "
            f"{r.get('decode_64_ms', 0):.2f} | {r['roofline_ms']:.2f} | "
            f"{'yes' if r['one_pool_fits'] else 'no: ' + r['one_pool_why'][:60]} "
            f"| {r['compile_s']:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--generations", default="v5e,v6e,v5p")
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--chips", default=",".join(map(str, CHIPS)), help="slice sizes to try")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--render", metavar="FILE", help="the Markdown table of saved JSON lines")
    parser.add_argument(
        "--smoke", action="store_true", help="one model that fits no single v5e chip (no compile)"
    )
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            print(markdown([json.loads(line) for line in f if line.strip()]))
        return 0
    if args.smoke:
        args.models, args.generations, args.chips = "gpt-oss-120b", "v5e", "1"
    chips = tuple(int(c) for c in args.chips.split(","))
    rows = []
    for generation in args.generations.split(","):
        for model in args.models.split(","):
            row = smallest(model, generation, args.context, args.batch, chips)
            rows.append(row)
            if not args.markdown:
                print(json.dumps(row), flush=True)
    if args.markdown:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
