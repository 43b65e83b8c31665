"""`swajax serve` warms up by default: it says how many step programs it made ready before its
ready line, and a short mixed load afterwards (plain, streamed, chat with string and text-part
content, n > 1, penalties, logprobs, echo, token rules, stop strings, bad parameters) compiles
nothing: the counters of /metrics do not move, and every good request is answered."""

import re
import threading

import pytest
from helpers.server import demo_folder, http, serve

pytestmark = pytest.mark.xdist_group("warmup-server")  # one server for the module

# One request row bucket, one token bucket, one page bucket: five programs (an extend and a
# decode step with and without kept logits, a multi-step round).
ARGS = ["--dtype", "float32", "--max-running-requests", "4", "--page-size", "16"]
ARGS += ["--kv-budget-gib", "0.05", "--context-length", "256", "--chunked-prefill-size", "64"]
ARGS += ["--metrics-prefix", "vllm"]  # vLLM's own names, for its dashboards


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = demo_folder(tmp_path_factory.mktemp("m") / "demo")
    log = tmp_path_factory.mktemp("server") / "server.log"
    proc, base = serve(model, ARGS, log, warmup=True)
    yield base, log
    proc.terminate()
    proc.wait(60)


def counters(base: str) -> dict[str, float]:
    """The compile counters of /metrics, by series (labels included)."""
    status, text = http(f"{base}/metrics")
    assert status == 200
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if re.match(r"vllm:(xla_compilations|compilations|programs_loaded)_total", line)
    }


def mix() -> list[tuple[str, dict, int]]:
    """(route, body, the status it must get)."""
    c, ch = "/v1/completions", "/v1/chat/completions"
    out = []
    for i in range(4):
        prompt = f"def f{i}(x): return x * {i} " * (1 + 2 * i)  # (up to 168 of 256 tokens)
        out += [
            (c, dict(prompt=prompt, max_tokens=8, temperature=0), 200),
            (c, dict(prompt=prompt, max_tokens=12, stream=True, temperature=0.8, seed=i), 200),
            (c, dict(prompt=prompt, max_tokens=6, n=2, temperature=1.0, seed=i), 200),
            (c, dict(prompt=prompt, max_tokens=5, presence_penalty=0.5, logprobs=3), 200),
            (c, dict(prompt=prompt[:40], max_tokens=3, echo=True, logprobs=1), 200),
            (c, dict(prompt=prompt, max_tokens=9, logit_bias={"65": 3}, stop=[":"]), 200),
            (ch, dict(messages=[{"role": "user", "content": prompt}], max_tokens=7), 200),
            (
                ch,
                dict(
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=4,
                    logprobs=True,
                    top_logprobs=2,
                    frequency_penalty=0.3,
                ),
                200,
            ),
            (c, dict(prompt=prompt, max_tokens=4, top_p=-1), 400),
            (
                ch,
                dict(
                    messages=[dict(role="user", content=[dict(type="text", text=prompt)])],
                    max_tokens=5,
                ),
                200,
            ),
            (ch, dict(messages=[dict(role="user", content=[dict(type="image_url")])]), 400),
        ]
    return out


def test_serve_warms_up_before_it_is_ready_and_compiles_nothing_after(server):
    base, log = server
    text = log.read_text()
    warm = re.search(r"warm-up: (\d+) step programs ready \((\d+) compiled, (\d+) from", text)
    assert warm and int(warm[1]) == 5, text
    assert text.index("warm-up:") < text.index("ready on")
    before = counters(base)
    assert before["vllm:xla_compilations_total"] > 0  # the warm-up's own
    jobs, answers = mix(), []

    def client():
        while jobs:
            route, body, want = jobs.pop()
            status, answer = http(f"{base}{route}", dict(model="demo", **body))
            answers.append((status, want, answer[:200]))

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == len(mix())
    assert all(status == want for status, want, _ in answers), [a for a in answers if a[0] != a[1]]
    assert counters(base) == before  # no program compiled, none loaded, after the ready line


def test_vllm_names_and_phases(server):
    """Under `--metrics-prefix vllm` every series has vLLM's name; a request's queue, prefill
    and decode times add up to its end-to-end latency, and its token counts are histograms."""
    from prometheus_client.parser import text_string_to_metric_families

    from swajax.server.metrics import EVENTS, STATE

    base, _ = server
    body = dict(model="demo", prompt="def f(x):", max_tokens=6)
    assert http(f"{base}/v1/completions", body)[0] == 200
    families = {f.name: f for f in text_string_to_metric_families(http(f"{base}/metrics")[1])}
    assert {"vllm:" + n for n in {**STATE, **EVENTS}} <= set(families)
    assert not any(name.startswith("swajax:") for name in families)

    def total(name, suffix="_sum"):
        return next(s.value for s in families["vllm:" + name].samples if s.name.endswith(suffix))

    phases = sum(total(f"request_{p}_time_seconds") for p in ("queue", "prefill", "decode"))
    e2e, count = (
        total("e2e_request_latency_seconds"),
        total("e2e_request_latency_seconds", "_count"),
    )
    assert 0 < phases <= e2e + 1e-6 and e2e - phases < 0.05 * count  # (each: its last hand-out)
    assert total("request_inference_time_seconds") <= phases + 1e-6
    assert total("request_generation_tokens", "_count") == count  # one per finished sample
    assert 0 < total("request_generation_tokens") <= total("generation_tokens", "_total")
    info = families["vllm:cache_config_info"].samples[0]
    assert info.value == 1 and info.labels["block_size"] == "16"
    assert info.labels["enable_prefix_caching"] == "True"
