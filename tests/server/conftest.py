"""A real `swajax serve` process on 127.0.0.1 over the demo model, in a folder of its own with a
byte-level `tokenizer.json` (the same bytes the demo's built-in tokenizer uses) and a chat
template, so both endpoints have text."""

import pytest
from helpers.server import SETTINGS, demo_folder, serve


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return demo_folder(tmp_path_factory.mktemp("m") / "demo")


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    proc, base = serve(model, ["--max-waiting", "64", *SETTINGS], log)
    yield base
    proc.terminate()  # graceful: uvicorn's shutdown runs the engine loop's, then re-raises
    proc.wait(30)
    assert "stopped; 0 request(s) in flight aborted, 0 running" in log.read_text()
