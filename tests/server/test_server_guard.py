"""`swajax serve` facing strangers, as a real process: a key required and checked, bodies over
the limit refused (413) while /health stays fast, one client unable to fill the queue for the
others, a runaway chat template stopped, every error in OpenAI's shape, a ready line, and
SIGTERM aborting the requests in flight instead of waiting for them.

One server for the module (its tests share an xdist group and run in file order; the last one
stops it)."""

import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from helpers.server import SETTINGS, demo_folder, serve

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.xdist_group("guarded-server")

KEY = "sk-test-0123"
# A template that loops for hours (10^10 iterations) when the user says "spin".
HOSTILE = (
    "{% if messages[-1].content == 'spin' %}{% for i in range(100000) %}"
    "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = demo_folder(tmp_path_factory.mktemp("m") / "demo")
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": HOSTILE}))
    args = ["--max-waiting", "4", "--max-body-mib", "1", *SETTINGS]
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "SWAJAX_API_KEY": KEY}
    proc, base = serve(model, args, log, env)
    yield base, proc, log
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def call(url, body=None, *, key=KEY, raw=None, method=None, timeout=60):
    """(status, parsed JSON body) of a request with the bearer key (None: no header)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def is_openai_error(body, status) -> bool:
    error = body.get("error", {})
    return isinstance(error.get("message"), str) and error.get("code") in (status, error["code"])


def test_the_ready_line_names_the_address_the_model_and_the_key(server):
    base, _, log = server
    line = next(x for x in log.read_text().splitlines() if "ready on" in x)
    assert f"ready on {base}" in line and "model demo" in line and "API key required" in line


def test_tokenize_needs_the_key_and_a_huge_prompt_stalls_no_one(server):
    base, _, _ = server
    for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [120]})):
        assert call(f"{base}{path}", body, key=None)[0] == 401
        assert call(f"{base}{path}", body)[0] == 200
    # ~1M characters (under this server's 1 MiB body limit): a 400 naming the context, while
    # /health keeps answering (a ceiling only a stalled event loop reaches).
    answer = {}
    huge = {"prompt": "x" * 1_000_000}
    worker = threading.Thread(target=lambda: answer.update(r=call(f"{base}/tokenize", huge)))
    worker.start()
    slowest = 0.0
    while worker.is_alive():
        start = time.perf_counter()
        assert call(f"{base}/health", key=None)[0] == 200
        slowest = max(slowest, time.perf_counter() - start)
    worker.join()
    status, body = answer["r"]
    assert status == 400 and "over the context limit" in body["error"]["message"]
    assert slowest < 5.0


def test_a_key_is_required_on_v1_and_checked(server):
    base, _, _ = server
    body = {"prompt": "x", "max_tokens": 2}
    for key in (None, "sk-wrong", KEY + "0"):
        status, error = call(f"{base}/v1/completions", body, key=key)
        assert status == 401 and error["error"]["code"] == "invalid_api_key"
    assert call(f"{base}/health", key=None)[0] == 200  # probes need no secret
    api = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=60)
    assert api.completions.create(model="demo", prompt="x", max_tokens=2).usage.total_tokens
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base}/v1", api_key="sk-no", max_retries=0).models.list()


def send_large(base, *, chunked: bool, size=10 * 2**20):
    """Post `size` bytes slowly over a raw socket (declared, or chunked with no length) and
    return the status line the server answers with, without sending more than it reads."""
    host, port = base.removeprefix("http://").split(":")
    length = "transfer-encoding: chunked" if chunked else f"content-length: {size}"
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {KEY}"
        f"\r\ncontent-type: application/json\r\n{length}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        sent, piece = 0, b"x" * 65536
        sock.settimeout(0.05)
        while sent < size:
            try:
                reply = sock.recv(4096)
                if reply:
                    return read_reply(sock, reply)
            except TimeoutError:
                pass
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            except OSError:
                break
            sent += len(piece)
        return read_reply(sock, b"")


def read_reply(sock, reply: bytes):
    """(status line, whole response) once the declared body has arrived."""
    sock.settimeout(30)
    while True:
        head, _, body = reply.partition(b"\r\n\r\n")
        lengths = [x for x in head.lower().split(b"\r\n") if x.startswith(b"content-length:")]
        if lengths and len(body) >= int(lengths[0].split(b":")[1]):
            return reply.split(b"\r\n")[0].decode(), reply
        more = sock.recv(4096)
        if not more:
            return reply.split(b"\r\n")[0].decode(), reply
        reply += more


def test_a_large_body_is_refused_and_health_stays_fast(server):
    base, _, _ = server
    for chunked in (False, True):
        result = {}
        thread = threading.Thread(
            target=lambda c=chunked, out=result: out.update(r=send_large(base, chunked=c))
        )
        thread.start()
        latencies = []
        while thread.is_alive() or not latencies:
            start = time.perf_counter()
            assert call(f"{base}/health", key=None)[0] == 200
            latencies.append(time.perf_counter() - start)
        thread.join()
        status, reply = result["r"]
        assert " 413 " in status and b"limit is 1,048,576 bytes" in reply, reply
        assert max(latencies) < 5.0, latencies  # a ceiling only a stalled loop reaches


def test_one_client_cannot_lock_the_others_out(server):
    base, _, _ = server
    flood = {"prompt": ["a", "b", "c", "d", "e", "f", "g", "h"], "n": 8, "max_tokens": 2}
    status, error = call(f"{base}/v1/completions", flood)
    assert status == 400 and "--max-waiting" in error["error"]["message"]
    status, body = call(f"{base}/v1/completions", {"prompt": "ok", "max_tokens": 2})
    assert status == 200 and len(body["choices"]) == 1


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"prompt": "x", "top_k": 10**12}, "top_k"),
        ({"prompt": "x", "top_k": 100000}, "vocabulary"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [True, 5]}, "prompt"),
        ({"prompt": "x", "stop_token_ids": [True]}, "stop_token_ids"),
        ({"prompt": "x", "repetition_penalty": 1e39}, "repetition_penalty"),
    ],
)
def test_values_the_step_cannot_hold_are_400(server, body, needle):
    base, _, _ = server
    status, error = call(f"{base}/v1/completions", body)
    assert status == 400 and needle in error["error"]["message"], error
    assert call(f"{base}/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200


def test_every_error_is_in_openais_shape(server):
    base, _, _ = server
    for status, body in (
        call(f"{base}/v1/completions", raw=b"{not json"),
        call(f"{base}/v1/nothing", {"prompt": "x"}),
        call(f"{base}/v1/completions", method="GET"),
        call(f"{base}/v1/completions", raw=b"[1, 2]"),
    ):
        assert status in (400, 404, 405) and is_openai_error(body, status), (status, body)


def test_a_runaway_chat_template_is_stopped_and_the_server_goes_on(server):
    base, _, _ = server
    start = time.perf_counter()
    status, error = call(
        f"{base}/v1/chat/completions",
        {"messages": [{"role": "user", "content": "spin"}], "max_tokens": 2},
    )
    assert status == 400 and "within 2 s" in error["error"]["message"]
    assert time.perf_counter() - start < 60  # killed at 2 s; the ceiling only a hang reaches
    status, body = call(
        f"{base}/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert status == 200 and body["choices"][0]["message"]["content"] is not None


def _stream(base, body, events, started):
    """A streamed completion read line by line: every data event into `events`, `started` set
    once the first token arrived."""
    req = urllib.request.Request(
        f"{base}/v1/completions",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                started.set()


def _running(base) -> float:
    with urllib.request.urlopen(f"{base}/metrics", timeout=60) as r:
        text = r.read().decode()
    line = next(x for x in text.splitlines() if x.startswith("swajax:num_requests_running{"))
    return float(line.split()[-1])


def test_sigterm_answers_every_client(server):
    """Last: it stops the module's server. Two streams and a plain request are in flight (each
    seen producing tokens, not slept for); SIGTERM answers all three at once with the reason,
    a request arriving meanwhile gets 503 with Retry-After, and the process exits. No bound in
    seconds but ceilings only a hang reaches."""
    base, proc, log = server
    body = {"prompt": "x", "max_tokens": 400, "ignore_eos": True}
    streams = [([], threading.Event()) for _ in range(2)]
    threads = [
        threading.Thread(target=_stream, args=(base, body, events, started))
        for events, started in streams
    ]
    plain = {}
    threads.append(
        threading.Thread(target=lambda: plain.update(r=call(f"{base}/v1/completions", body)))
    )
    for t in threads:
        t.start()
    for _, started in streams:
        assert started.wait(120)
    while _running(base) < 3:  # the plain one admitted too
        assert not plain, plain
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    late = urllib.request.Request(
        f"{base}/v1/completions",
        data=json.dumps({"prompt": "x", "max_tokens": 2}).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(late, timeout=60)
    assert refused.value.code == 503 and refused.value.headers["retry-after"]
    refused.value.close()
    for t in threads:
        t.join(120)
    for events, _ in streams:
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert "server shutting down" in error["message"]
    status, error = plain["r"]
    assert status == 500 and "server shutting down" in error["error"]["message"]
    proc.wait(120)
    # The step in progress ends within its bound, or (a compile on a loaded machine) is left
    # after it: every client had its answer either way.
    text = log.read_text()
    assert (
        "stopped; 3 request(s) in flight aborted, 0 running" in text
        or "step in progress outlived 10 s and was left (every client had its answer)" in text
    ), text
