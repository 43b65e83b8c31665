"""A real `swajax serve` process on 127.0.0.1 over the demo model, in a folder of its own with a
byte-level `tokenizer.json` (the same bytes the demo's built-in tokenizer uses) and a chat
template, so both endpoints have text."""

import subprocess
import sys
import time

import pytest
from helpers.server import SETTINGS, demo_folder, free_port, http


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return demo_folder(tmp_path_factory.mktemp("m") / "demo")


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    port = free_port()
    main = "import sys; from swajax.cli.main import main; sys.exit(main())"
    cmd = [
        sys.executable,
        "-c",
        main,
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--max-waiting",
        "64",
        *SETTINGS,
    ]
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if http(f"{base}/health")[0] == 200:
                break
        except OSError:
            time.sleep(0.3)
        if proc.poll() is not None:
            raise RuntimeError(log.read_text())
    yield base
    proc.terminate()  # graceful: uvicorn's shutdown runs the engine loop's, then re-raises
    proc.wait(30)
    assert "stopped; 0 request(s) in flight aborted, 0 running" in log.read_text()
