"""Trace size and replay speed, format 2 (plain lists) against format 3 (delta-encoded, and
gzip), on a long-context trace recorded in the same run.

    python benchmarks/trace.py [--requests 8] [--preset tiny-hybrid] [--chunk 1024]

Records a null-model run of the long-context workload (prompts of 16-32K tokens), writes it in
format 3 (plain and .gz) and rewrites the same operations in format 2, then replays each file
and reports bytes and operations per second.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from swajax import sizing
from swajax.presets import load_preset
from swajax.serving.options import EngineOptions
from swajax.simulator.run import run_workload
from swajax.simulator.workloads import make_workload
from swajax.trace.recorder import Tracer
from swajax.trace.replay import read_lines, replay


def main(argv=None) -> int | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--preset", default="tiny-hybrid")
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.requests, args.chunk = 2, 4096
    cfg = load_preset(args.preset)
    sizes = sizing.solve_pool_sizes(cfg, 1 << 18, ratio=0.25, page_size=16)
    tracers = []
    options = EngineOptions(max_running=64, max_context=33_792, chunk_size=args.chunk)
    run_workload(
        cfg,
        sizes,
        make_workload("long-context", args.requests, 0),
        options=options,
        progress=False,
        on_engine=lambda e: tracers.append(Tracer(e)),
    )
    folder = Path(tempfile.mkdtemp())
    v3, v3gz, v2 = folder / "t3.jsonl", folder / "t3.jsonl.gz", folder / "t2.jsonl"
    tracers[0].write(v3)
    tracers[0].write(v3gz)
    header, *ops = read_lines(v3)
    old = {k: v for k, v in header.items() if k not in ("config", "profile")} | {"version": 2}
    v2.write_text("".join(json.dumps(line) + "\n" for line in [old, *ops]))
    print(f"{len(ops):,} operations, {args.requests} long-context requests, chunk {args.chunk}")
    print(f"{'format':16}{'bytes':>14}{'replay s':>10}{'ops/s':>10}")
    base = None
    for name, path in (("2 (plain)", v2), ("3", v3), ("3 + gzip", v3gz)):
        start = time.perf_counter()
        result = replay(path)
        seconds = time.perf_counter() - start
        assert result["ok"], result
        size = path.stat().st_size
        base = base or size
        print(
            f"{name:16}{size:>14,}{seconds:>10.2f}{len(ops) / seconds:>10,.0f}"
            f"   {base / size:5.1f}x smaller"
        )


if __name__ == "__main__":
    main()
