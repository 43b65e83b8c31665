"""`/health` latency of a real `swajax serve` process under five loads, side by side in one run:
idle, while 10 MB bodies are being refused (413, never parsed), while 64 clients stream, and
the hostile requests under the body limit that used to hold the event loop: an 8,000,000-
character prompt to `/tokenize`, and a 2,700,000-id prompt to `/v1/completions` (both refused
with 400, back to back).

    python benchmarks/server_health.py [--clients 64] [--probes 200] [--body-mb 10]

The embedded demo model, `--max-body-mib 8` (the default). Each load runs while a prober
calls `/health` every 10 ms; prints p50 / p99 / max milliseconds per load and the ratio of
each p99 to the idle one. The streaming load: `--clients` `openai` clients, each streaming 64
greedy tokens (eos ignored) and starting another until the probes are done.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np

SETTINGS = ["--max-running-requests", "64", "--page-size", "16", "--kv-budget-gib", "0.1"]
SETTINGS += ["--context-length", "512", "--max-waiting", "256"]


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    main = "import sys; from swajax.cli.main import main; sys.exit(main())"
    cmd = [sys.executable, "-c", main, "serve", "--port", str(port), *SETTINGS]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "ready on" in line:
            break
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
    return proc, f"http://127.0.0.1:{port}"


def probe(base: str, n: int) -> list[float]:
    """Milliseconds of `n` /health calls, one every 10 ms (a load is measured over seconds)."""
    out = []
    for _ in range(n):
        time.sleep(0.01)
        start = time.perf_counter()
        with urllib.request.urlopen(f"{base}/health", timeout=60) as r:
            r.read()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def big_body(base: str, megabytes: float, done: threading.Event) -> None:
    """Post a body of `megabytes` over and over (each refused with 413) until `done`."""
    host, port = base.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "x" * int(megabytes * 1e6), "max_tokens": 1}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    while not done.is_set():
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(head)
            try:
                sock.sendall(body)
            except OSError:  # refused before the body was read: the server hung up
                pass
            reply = sock.recv(64)
            assert b" 413 " in reply, reply


def hostile(base: str, path: str, body: dict, done: threading.Event) -> int:
    """Post `body` to `path` over and over (each answered 400) until `done`; how many."""
    data, count = json.dumps(body).encode(), 0
    while not done.is_set():
        req = urllib.request.Request(
            base + path, data=data, headers={"content-type": "application/json"}
        )
        try:
            urllib.request.urlopen(req, timeout=120).read()
        except urllib.error.HTTPError as e:
            assert e.code == 400, e.code
        count += 1
    return count


async def stream_clients(base: str, clients: int, done: threading.Event) -> int:
    import openai

    finished = 0

    async def client(i: int):
        nonlocal finished
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none") as api:
            while not done.is_set():
                stream = await api.completions.create(
                    model="tiny",
                    prompt=f"def task_{i}(x):",
                    max_tokens=64,
                    temperature=0,
                    stream=True,
                    extra_body=dict(ignore_eos=True),
                )
                async for _ in stream:
                    pass
                finished += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    return finished


def under(base: str, load, probes: int) -> tuple[list[float], object]:
    done = threading.Event()
    result = {}
    worker = threading.Thread(target=lambda: result.update(r=load(done)))
    worker.start()
    time.sleep(3.0)  # the load is under way (64 clients connected and streaming)
    latencies = probe(base, probes)
    done.set()
    worker.join(120)
    return latencies, result.get("r")


def row(name: str, ms: list[float], idle_p99: float | None) -> str:
    p50, p99 = np.percentile(ms, 50), np.percentile(ms, 99)
    ratio = f"{p99 / idle_p99:8.1f}" if idle_p99 else "       -"
    return f"{name:<34} {len(ms):>6} {p50:8.2f} {p99:8.2f} {max(ms):8.2f} {ratio}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--body-mb", type=float, default=10.0)
    ap.add_argument("--smoke", action="store_true", help="4 clients, 20 probes, a 9 MB body")
    args = ap.parse_args(argv)
    if args.smoke:
        args.clients, args.probes, args.body_mb = 4, 20, 9.0
    proc, base = start_server()
    try:
        probe(base, 20)  # warm-up
        idle = probe(base, args.probes)
        refused, _ = under(base, lambda d: big_body(base, args.body_mb, d), args.probes)
        streaming, finished = under(
            base, lambda d: asyncio.run(stream_clients(base, args.clients, d)), args.probes
        )
        text = {"prompt": "x" * 8_000_000}
        tokenize, n_tok = under(base, lambda d: hostile(base, "/tokenize", text, d), args.probes)
        ids = {"prompt": [7] * 2_700_000, "max_tokens": 1}
        long_ids, n_ids = under(
            base, lambda d: hostile(base, "/v1/completions", ids, d), args.probes
        )
    finally:
        proc.terminate()
        proc.wait(60)
    idle_p99 = float(np.percentile(idle, 99))
    print(f"{'load':<34} {'probes':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'p99/idle':>8}")
    print(row("idle", idle, None))
    print(row(f"{args.body_mb:g} MB bodies refused (413)", refused, idle_p99))
    print(row(f"{args.clients} clients streaming", streaming, idle_p99))
    print(row("8M-char /tokenize (400)", tokenize, idle_p99))
    print(row("2.7M-id /v1/completions (400)", long_ids, idle_p99))
    print(f"({finished} streams of 64 tokens finished during the streaming probes; ", end="")
    print(f"{n_tok} /tokenize and {n_ids} long-id requests answered during theirs)")


if __name__ == "__main__":
    main()
