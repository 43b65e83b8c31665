"""A fresh `swajax serve` of the demo model under a mixed load of many clients: what every good
request waits, whether the server compiles while it serves, and whether the pools are whole
after.

    python benchmarks/soak.py [--requests 2000] [--clients 24] [--seed 0]

The mix, drawn per request: completions (plain or streamed, 10% of streams cut off after their
first chunk), chat, and bad parameters (a 400 expected); n from 1 to 3, a stop string on a
fifth, sampled or greedy, penalties and logprobs on some, prompts of 1 to 300 characters and
max_tokens from 1 to 64. Prints the requests by outcome, the good requests' latency p50 / p99,
the programs compiled after the ready line (`swajax:compilations_total`), the 5xx count, and
whether every pool token is free or the prefix cache's (unlocked) once the load has drained.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

SETTINGS = ["--max-running-requests", "16", "--page-size", "16", "--kv-budget-gib", "0.05"]
SETTINGS += ["--context-length", "512", "--max-waiting", "256"]
WORDS = "def fibonacci ( n ) : return if else for in range while import numpy as np x".split()


def start_server(folder: Path, extra: list[str]) -> tuple[subprocess.Popen, str, float]:
    """A fresh `swajax serve` of the demo model in `folder`, once it says it is ready; and how
    long that took."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    main = "import sys; from swajax.cli.main import main; sys.exit(main())"
    cmd = [sys.executable, "-c", main, "serve", "--model", str(folder), "--port", str(port)]
    cmd += [*SETTINGS, *extra]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        sys.stderr.write(line)
        if "ready on" in line:
            break
    drain = threading.Thread(target=_drain, args=(proc.stderr,), daemon=True)
    drain.start()
    proc.drain = drain  # joined once the server has stopped (its pipe is then closed)
    return proc, f"http://127.0.0.1:{port}", time.perf_counter() - start


def _drain(pipe) -> None:
    """The server's lines after ready go to $SOAK_SERVER_LOG (if set), else nowhere."""
    import os

    path = os.environ.get("SOAK_SERVER_LOG")
    with pipe, open(path or os.devnull, "w") as out:
        for line in pipe:
            out.write(line)


def metrics(base: str) -> dict[str, float]:
    """Unlabelled-by-anything-but-the-model values, summed over other labels."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=60) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("swajax:") and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0].removeprefix("swajax:")
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def draw(rng: random.Random) -> tuple[str, dict, bool, bool, bool]:
    """(route, body, streamed, cut off early, a 400 expected)."""
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))[:300]
    body = dict(model="demo", max_tokens=rng.randint(1, 64), n=rng.randint(1, 3))
    if rng.random() < 0.5:
        body.update(temperature=rng.choice([0.7, 1.0]), seed=rng.randrange(1 << 20))
    else:
        body["temperature"] = 0.0
    if rng.random() < 0.2:
        body["stop"] = [rng.choice(["\n", ":", "return"])]
    if rng.random() < 0.2:
        body["presence_penalty"] = 0.5
    kind = rng.random()
    bad = kind < 0.1
    if bad:
        body[rng.choice(["temperature", "top_p", "n"])] = -1
    route = "/v1/chat/completions" if 0.1 <= kind < 0.3 else "/v1/completions"
    if route.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": prompt}]
        if rng.random() < 0.2:
            body.update(logprobs=True, top_logprobs=2)
    else:
        body["prompt"] = prompt
        if rng.random() < 0.2:
            body["logprobs"] = 2
    stream = rng.random() < 0.4
    body["stream"] = stream
    return route, body, stream, stream and rng.random() < 0.25, bad


def client(base: str, jobs: list, results: list) -> None:
    """One client: takes the next request until none is left (a thread; list.pop is atomic)."""
    host, port = base.removeprefix("http://").split(":")
    while True:
        try:
            route, body, stream, cut, bad = jobs.pop()
        except IndexError:
            return
        start = time.perf_counter()
        conn = http.client.HTTPConnection(host, int(port), timeout=600)
        try:
            data = json.dumps(body).encode()
            conn.request("POST", route, data, {"content-type": "application/json"})
            r = conn.getresponse()
            status = r.status
            if cut:
                r.readline()  # the first chunk, then the client goes away
                answer = b""
            else:
                answer = r.read()
        except OSError as e:
            results.append(("transport", repr(e), 0.0))
            continue
        finally:
            conn.close()
        took = time.perf_counter() - start
        if bad:
            results.append(("bad" if status == 400 else f"bad answered {status}", "", took))
        elif cut:
            results.append(("cut", status, took))
        else:
            why = "" if status == 200 else answer.decode(errors="replace")[:300]
            results.append(("good" if status == 200 else f"status {status}", why, took))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="6 requests, 2 clients (tests)")
    ap.add_argument(
        "--no-warmup", action="store_true", help="serve without the warm-up (shapes per batch)"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.requests, args.clients = 6, 2
    rng = random.Random(args.seed)
    jobs = [draw(rng) for _ in range(args.requests)]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.helpers.server import demo_folder  # a byte-level tokenizer and a chat template

    scratch = tempfile.TemporaryDirectory(prefix="soak-")
    folder = demo_folder(Path(scratch.name) / "demo")
    proc, base, ready = start_server(folder, ["--no-warmup"] if args.no_warmup else [])
    try:
        before = metrics(base)
        results: list = []
        start = time.perf_counter()

        threads = [
            threading.Thread(target=client, args=(base, jobs, results)) for _ in range(args.clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        deadline = time.time() + 120
        while time.time() < deadline:  # the drain: nothing running, nothing queued
            after = metrics(base)
            if after["num_requests_running"] == after["num_requests_waiting"] == 0:
                break
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(60)
        proc.drain.join(60)
        scratch.cleanup()
    outcomes: dict[str, int] = {}
    for kind, *_ in results:
        outcomes[kind] = outcomes.get(kind, 0) + 1
    good = [t for kind, _, t in results if kind == "good"]
    compiled = after.get("compilations_total", 0) - before.get("compilations_total", 0)
    xla = after.get("xla_compilations_total", 0) - before.get("xla_compilations_total", 0)
    whole = (
        after["full_pool_free_tokens"] + after["full_cached_evictable_tokens"]
        == after["full_pool_tokens"]
        and after["full_cached_locked_tokens"] == 0
    )
    five = sum(n for k, n in outcomes.items() if "status 5" in k or "answered 5" in k)
    print(f"ready after {ready:.1f} s")
    for why in sorted({why for kind, why, _ in results if kind.startswith("status")})[:5]:
        print(f"  a good request was refused: {why}")
    print(f"{args.requests} requests, {args.clients} clients, {wall:.1f} s: {json.dumps(outcomes)}")
    if good:
        p50, p99 = np.percentile(good, 50), np.percentile(good, 99)
        print(f"good requests: {len(good)}, latency p50 {p50:.2f} s, p99 {p99:.2f} s")
    print(
        f"step programs compiled after ready: {compiled:g} (XLA programs of any kind: {xla:g}); "
        f"5xx: {five}; pools whole: {whole}"
    )


if __name__ == "__main__":
    main()
