"""Helpers of the server tests: the demo model with a tokenizer.json, plain HTTP calls."""

import json
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import swajax.demo

TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# float32: the tests compare the server's tokens and logprobs with the Python API's to 1e-5,
# across prefix hits the server's earlier requests left; in the demo's own bfloat16 a reused
# prefix is not bit for bit a fresh one (XLA:CPU's products differ by batch shape in the last
# bit, which bfloat16 activations round into a visible difference).
SETTINGS = [
    "--dtype",
    "float32",
    "--max-running-requests",
    "16",
    "--page-size",
    "4",
    "--kv-budget-gib",
    "0.05",
    "--context-length",
    "512",
    "--host-cache-gib",
    "0.05",
]
# The same settings as `swajax.LLM` keywords (the server's host tier aside), for the runs the
# server's answers are compared with.
LLM_SETTINGS = dict(
    dtype="float32", max_running_requests=16, page_size=4, kv_budget_gib=0.05, max_model_len=512
)


def demo_folder(path):
    """The demo model with a byte-level tokenizer.json (id = byte) and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    src = pathlib.Path(swajax.demo.__file__).parent
    path.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(src / f, path / f)
    tok = Tokenizer(models.BPE({c: b for b, c in enumerate(_byte_chars())}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return path


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character map (the ByteLevel pre-tokenizer's), by byte."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def http(url: str, body=None, raw: bytes | None = None):
    """(status, body text) of a GET, or a POST of JSON `body` (or `raw` bytes as JSON)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(model, args, log, env=None, warmup=False):
    """A `swajax serve --model model *args` process writing to `log`, once it says it is ready:
    (process, base URL). Raises with the log if it exits, or if it hangs (not ready in ten
    minutes). Without `warmup` the server skips its warm-up (`--no-warmup`): the tests of what
    it answers start it in seconds; tests/server/test_warmup_server.py serves warmed up."""
    port = free_port()
    main = "import sys; from swajax.cli.main import main; sys.exit(main())"
    cmd = [sys.executable, "-c", main, "serve", "--model", str(model), "--port", str(port)]
    cmd += [] if warmup else ["--no-warmup"]
    with open(log, "w") as out:
        proc = subprocess.Popen([*cmd, *args], stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 600
    while "ready on" not in log.read_text():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(log.read_text())
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}"
