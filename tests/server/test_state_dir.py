"""`swajax serve --state-dir`: a server stopped with SIGTERM saves its prefix cache, and the
same command started again serves its first request from it (the hit reported in the usage
counters), with the tokens the first server gave."""

import json

from helpers.server import demo_folder, http, serve

SETTINGS = ["--dtype", "float32", "--page-size", "4", "--kv-budget-gib", "0.02"]
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n" * 3


def _serve(model, state, log):
    return serve(model, [*SETTINGS, "--state-dir", str(state)], log)


def _complete(base):
    body = dict(model="demo", prompt=PROMPT, max_tokens=8, temperature=0.0)
    status, text = http(f"{base}/v1/completions", body)
    assert status == 200, text
    answer = json.loads(text)
    details = answer["usage"].get("prompt_tokens_details") or {}
    return answer["choices"][0]["text"], details.get("cached_tokens", 0)


def test_a_restarted_server_serves_warm(tmp_path):
    model = demo_folder(tmp_path / "demo")
    state = tmp_path / "state"
    proc, base = _serve(model, state, tmp_path / "first.log")
    text, cached = _complete(base)
    proc.terminate()
    proc.wait(60)
    first = (tmp_path / "first.log").read_text()
    assert cached == 0 and "starting cold" in first and "saved the prefix cache" in first
    proc, base = _serve(model, state, tmp_path / "second.log")
    try:
        again, cached = _complete(base)
    finally:
        proc.terminate()
        proc.wait(60)
    assert "restored the prefix cache" in (tmp_path / "second.log").read_text()
    assert cached > 0 and again == text
