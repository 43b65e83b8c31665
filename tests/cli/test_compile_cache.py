"""Compile once: a second engine in the process compiles nothing new for the same shapes, and a
second command-line run reuses the first's programs from the persistent cache."""

import json
import os
import subprocess
import sys

import pytest

from swajax.api import EngineSpec, generate, make_engine
from swajax.compile_cache import default_dir
from swajax.demo import demo_decoder
from swajax.serving.sampling_params import SamplingParams


def test_a_second_engine_compiles_nothing_new():
    decoder, setup = demo_decoder(), EngineSpec.of()
    prompts = [[5, 6, 7, 8, 9, 10], [1, 2, 3]]
    generate(make_engine(decoder, setup), prompts, SamplingParams(temperature=0.0, max_tokens=6))
    second = make_engine(decoder, setup)
    generate(second, prompts, SamplingParams(temperature=0.0, max_tokens=6))
    assert second.metrics[-1].compilations == 0


def test_a_second_cli_run_compiles_fewer_programs(tmp_path):
    env = dict(os.environ, SWAJAX_COMPILE_CACHE=str(tmp_path / "cache"))
    argv = [sys.executable, "-m", "swajax", "generate", "--prompt-ids", "1,2,3"]
    argv += ["--max-tokens", "3", "--json"]

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


def _generate(env, *extra):
    argv = [sys.executable, "-m", "swajax", "generate", "--prompt-ids", "1,2,3"]
    argv += ["--max-tokens", "3", "--json", *extra]
    return subprocess.run(argv, env=env, capture_output=True, text=True)


def _summary(out) -> dict:
    return json.loads(out.stdout.strip().splitlines()[-1])["summary"]


def test_an_unusable_cache_folder_is_a_warning_and_the_run_goes_on(tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    env = dict(os.environ, SWAJAX_COMPILE_CACHE=str(tmp_path / "a_file" / "cache"))
    out = _generate(env)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if line]
    assert len(warnings) == 1 and "warning: the compile cache" in warnings[0]
    assert "cannot be used" in warnings[0] and "running without it" in warnings[0]
    assert _summary(out)["compile_cache_hits"] == 0


def test_a_corrupt_entry_is_ignored_and_replaced(tmp_path):
    cache = tmp_path / "cache"
    env = dict(os.environ, SWAJAX_COMPILE_CACHE=str(cache))
    first = _generate(env)
    assert first.returncode == 0, first.stderr
    entries = sorted(p for p in cache.iterdir() if p.name.endswith("-cache"))
    for entry in entries:  # as a process killed while writing leaves them
        entry.write_bytes(entry.read_bytes()[: len(entry.read_bytes()) // 3])
    second = _generate(env)
    assert second.returncode == 0, second.stderr
    assert "unreadable; replaced" in second.stderr and "Traceback" not in second.stderr
    assert json.loads(second.stdout.splitlines()[0]) == json.loads(first.stdout.splitlines()[0])
    third = _generate(env)  # the replaced entries read back
    assert third.returncode == 0 and third.stderr == ""
    summary = _summary(third)  # (the step programs come ready-compiled from the program store)
    assert summary["compile_cache_hits"] + summary["programs_loaded"] >= len(entries)


@pytest.mark.slow  # the cache's reuse is tested above; this adds a second writer
def test_two_processes_sharing_one_cache_never_fail(tmp_path):
    env = dict(os.environ, SWAJAX_COMPILE_CACHE=str(tmp_path / "shared"))
    argv = [sys.executable, "-m", "swajax", "generate", "--prompt-ids", "1,2,3"]
    argv += ["--max-tokens", "3", "--json"]
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    assert outs[0][0].splitlines()[0] == outs[1][0].splitlines()[0]
    assert "Traceback" not in outs[0][1] + outs[1][1]
