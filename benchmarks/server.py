"""`swajax serve` against the Python API on the same workload: the server's overhead as a ratio.

    python benchmarks/server.py [--requests 32] [--new 32] [--concurrency 1,8,32]

The embedded demo model; `--requests` prompts of about 40 bytes, greedy, `--new` tokens each
(eos ignored). For each concurrency c: the server (a real `swajax serve` process on 127.0.0.1,
c streaming clients of the official `openai` package, each taking the next prompt when it is
done) and the Python API (`swajax.LLM.stream` over the same prompts, all submitted at once to
an engine running c at a time) in one run. Prints requests/s, tokens/s, p50 / p99 time to first
token for both (the server's from each request's send; the API's from the submission of all,
so it includes queueing) and server / API throughput. Two warm-up passes of each compile every
shape first.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np

import swajax

# The engine's settings, as `LLM` names them and as `swajax serve`'s flags spell them.
# float32, as the figures in benchmarks/README.md were measured (the demo's own dtype is bfloat16)
SETTINGS = dict(
    dtype="float32", max_running_requests=32, page_size=16, kv_budget_gib=0.05, max_model_len=512
)
FLAGS = dict(
    dtype="float32", max_running_requests=32, page_size=16, kv_budget_gib=0.05, context_length=512
)


def prompts(n: int) -> list[str]:
    return [f"def task_{i}(values):\n    # step {i % 7}\n    total =" for i in range(n)]


def api_run(llm, texts, new: int):
    """(seconds, times to first token from submission): every prompt submitted at once to an
    engine that runs `max_running` (the concurrency) of them at a time."""
    params = swajax.SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    ttft, seen, start = [], set(), time.perf_counter()
    for event in llm.stream(texts, params):
        if event.index not in seen:
            seen.add(event.index)
            ttft.append(time.perf_counter() - start)
    return time.perf_counter() - start, ttft


async def server_run(base: str, texts, new: int, c: int):
    import openai

    queue = list(texts)
    ttft = []

    async def client():
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none") as api:
            while queue:
                prompt = queue.pop()
                t0, first = time.perf_counter(), True
                stream = await api.completions.create(
                    model="tiny",
                    prompt=prompt,
                    max_tokens=new,
                    temperature=0,
                    stream=True,
                    extra_body=dict(ignore_eos=True),
                )
                async for _ in stream:
                    if first:
                        ttft.append(time.perf_counter() - t0)
                        first = False

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(c)))
    return time.perf_counter() - start, ttft


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in FLAGS.items()]
    main = "import sys; from swajax.cli.main import main; sys.exit(main())"
    proc = subprocess.Popen(
        [sys.executable, "-c", main, "serve", "--port", str(port), *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(f"{base}/health", timeout=1)
            return proc, base
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the server did not start")


def _columns(requests: int, tokens: int, seconds: float, ttft) -> str:
    p50, p99 = np.percentile(np.asarray(ttft) * 1e3, [50, 99])
    return f"{requests / seconds:8.2f} {tokens / seconds:6.0f} {p50:7.0f}/{p99:<7.0f}"


def main(argv=None) -> int | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.requests, args.new, args.concurrency = 2, 4, "2"
    levels = [int(x) for x in args.concurrency.split(",")]
    texts = prompts(args.requests)
    proc, base = start_server()
    try:
        rows = []
        for c in levels:
            llm = swajax.LLM("tiny", **dict(SETTINGS, max_running_requests=c))
            # Warm-up: the first pass compiles the cold shapes, the second those of prefix hits
            # (the same prompts again), so the measured pass compiles nothing.
            for _ in range(0 if args.smoke else 2):
                api_run(llm, texts, args.new)
                asyncio.run(server_run(base, texts, args.new, c))
            a_sec, a_ttft = api_run(llm, texts, args.new)
            s_sec, s_ttft = asyncio.run(server_run(base, texts, args.new, c))
            n = len(texts)
            api = _columns(n, n * args.new, a_sec, a_ttft)
            server = _columns(n, n * args.new, s_sec, s_ttft)
            rows.append(f"{c:5d} | {api} | {server}    | {a_sec / s_sec:6.2f}")
    finally:
        proc.terminate()
        proc.wait(30)
    print(
        " conc | API req/s  tok/s  ttft p50/p99 ms | server req/s  tok/s  ttft p50/p99 ms "
        "| server/API tok/s"
    )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
