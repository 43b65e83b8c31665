"""Compile once: a second engine in the process compiles nothing new for the same shapes, and a
second command-line run reuses the first's programs from the persistent cache."""

import json
import os
import subprocess
import sys

from swajax.api import EngineSpec, generate, make_engine
from swajax.compile_cache import default_dir
from swajax.demo import demo_decoder
from swajax.serving.request import SamplingParams


def test_a_second_engine_compiles_nothing_new():
    decoder, setup = demo_decoder(), EngineSpec()
    prompts = [[5, 6, 7, 8, 9, 10], [1, 2, 3]]
    generate(make_engine(decoder, setup), prompts, SamplingParams(max_new_tokens=6))
    second = make_engine(decoder, setup)
    generate(second, prompts, SamplingParams(max_new_tokens=6))
    assert second.metrics[-1].compilations == 0


def test_a_second_cli_run_compiles_fewer_programs(tmp_path):
    env = dict(os.environ, SWAJAX_COMPILE_CACHE=str(tmp_path / "cache"))
    argv = [sys.executable, "-m", "swajax", "generate", "--prompt-ids", "1,2,3"]
    argv += ["--max-new-tokens", "3", "--json"]

    def run():
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])["summary"]

    first, second = run(), run()
    assert first["compilations"] > 0 and first["compile_cache_hits"] == 0
    assert second["compilations"] < first["compilations"]
    assert second["compile_cache_hits"] > 0
    assert any((tmp_path / "cache").iterdir())


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SWAJAX_COMPILE_CACHE", "off")
    assert default_dir() is None
    monkeypatch.setenv("SWAJAX_COMPILE_CACHE", str(tmp_path / "x"))
    assert default_dir() == tmp_path / "x"
    monkeypatch.delenv("SWAJAX_COMPILE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_dir() == tmp_path / "swajax" / "jax"
