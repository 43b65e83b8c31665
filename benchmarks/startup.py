"""Start-up cost of the README's first command: cold (empty compilation cache) and warm, and the
programs a run compiles with their compile times.

    python benchmarks/startup.py [--json]

Cold and warm runs are `swajax generate --prompt "def fibonacci(n):" --max-tokens 120
--json` in fresh subprocesses sharing one temporary cache folder (wall time from process start
to exit, `compilations` / `compile_cache_hits` / `programs_loaded` from the JSON summary); a
warm run with the program store off shows what tracing the step programs costs. The program
list comes from one more in-process run with the cache off and `jax_log_compiles` on.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARGV = ["generate", "--prompt", "def fibonacci(n):", "--max-tokens", "120"]


def timed_run(cache: str, argv=ARGV, store: bool = True) -> dict:
    env = {
        **os.environ,
        "SWAJAX_COMPILE_CACHE": cache,
        "PYTHONPATH": str(ROOT),
        "SWAJAX_PROGRAM_STORE": "on" if store else "off",
    }
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "swajax", *argv, "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    summary = json.loads(out.stdout.strip().splitlines()[-1])["summary"]
    return {
        "wall_s": wall,
        "compilations": summary["compilations"],
        "cache_hits": summary["compile_cache_hits"],
        "programs_loaded": summary["programs_loaded"],
    }


def programs(argv=ARGV) -> list[tuple[str, int, float]]:
    """(program, times compiled, seconds) of one in-process run with the cache off."""
    os.environ["SWAJAX_COMPILE_CACHE"] = "off"
    import jax

    jax.config.update("jax_log_compiles", True)
    found = []
    pattern = re.compile(r"Finished XLA compilation of (\S+) in ([\d.]+) sec")

    class Collect(logging.Handler):
        def emit(self, record):
            m = pattern.search(record.getMessage())
            if m:
                found.append((m.group(1), float(m.group(2))))

    logger, handler = logging.getLogger("jax"), Collect()
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    from swajax.cli.main import main

    try:
        main([*argv, "--no-compile-cache"])
    finally:  # leave the process as it was (tests run this in process)
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        jax.config.update("jax_log_compiles", False)
    counts = collections.Counter(name for name, _ in found)
    seconds = collections.defaultdict(float)
    for name, s in found:
        seconds[name] += s
    return sorted(((n, counts[n], seconds[n]) for n in counts), key=lambda x: -x[2])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--smoke", action="store_true", help="4 new tokens (tests)")
    a = p.parse_args(argv)
    run = [*ARGV[:-1], "4"] if a.smoke else ARGV
    with tempfile.TemporaryDirectory() as cache:
        cold = timed_run(cache, run)
        warm = timed_run(cache, run)
        # Warm with the program store off (`SWAJAX_PROGRAM_STORE=off`): the step programs are
        # traced and lowered, and JAX's cache supplies the compiled program (its first run
        # fills that cache with them); what a warm start cost before the store.
        timed_run(cache, run, store=False)
        traced = timed_run(cache, run, store=False)
        warm2 = timed_run(cache, run)
    listing = programs(run)
    runs = {"cold": cold, "warm": warm, "warm, store off": traced, "warm again": warm2}
    result = {**runs, "programs": [dict(name=n, count=c, seconds=s) for n, c, s in listing]}
    if a.json:
        print(json.dumps(result))
        return
    for name, r in runs.items():
        print(
            f"{name}: {r['wall_s']:.1f} s end to end, {r['compilations']} programs compiled, "
            f"{r['cache_hits']} from JAX's cache, {r['programs_loaded']} from the program "
            "store"
        )
    total = sum(c for _, c, _ in listing)
    print(f"programs of one run ({total}, {sum(s for *_, s in listing):.1f} s compiling):")
    for name, count, seconds in listing:
        print(f"  {count:>3} x {name:<32} {seconds:6.2f} s")


if __name__ == "__main__":
    main()
