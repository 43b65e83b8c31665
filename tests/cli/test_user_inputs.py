"""What users bring to the command line: the checkpoint's own stop tokens and context length,
several prompts for `logits`, inputs too large to read whole, and names for every bad flag."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import FIXTURES

from swajax.demo import DEMO_DIR

MIMO = FIXTURES / "mimo_v2_flash"  # eos_token_id 2 (config.json) is its 4th greedy token
MIMO_CASE = json.loads((MIMO / "greedy.json").read_text())
MIMO_IDS = ",".join(map(str, MIMO_CASE["prompt"]))


def _generate(cli, folder, *flags):
    code, out, err = cli(
        "generate",
        "--model",
        folder,
        "--prompt-ids",
        MIMO_IDS,
        "--max-tokens",
        "8",
        "--json",
        *flags,
    )
    assert code == 0, err
    return json.loads(out.splitlines()[0])


def _transformers_stop(greedy: list[int], eos: set[int]) -> list[int]:
    """transformers' `generate` with eos ids: its greedy tokens up to and including the first
    eos (the fixture's greedy run was made with eos_token_id=None, so it goes on past it)."""
    for i, t in enumerate(greedy):
        if t in eos:
            return greedy[: i + 1]
    return greedy


def test_generation_stops_at_the_checkpoints_eos(cli):
    assert json.loads((MIMO / "config.json").read_text())["eos_token_id"] == 2
    line = _generate(cli, MIMO)
    assert line["tokens"] == _transformers_stop(MIMO_CASE["greedy"], {2}) == [83, 18, 96, 2]
    assert line["finish_reason"] == "stop"
    line = _generate(cli, MIMO, "--ignore-eos")
    assert line["tokens"] == MIMO_CASE["greedy"] and line["finish_reason"] == "length"


def test_generation_config_ids_take_precedence(cli, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(MIMO, folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [96, 7]}))
    line = _generate(cli, folder)
    assert line["tokens"] == _transformers_stop(MIMO_CASE["greedy"], {96, 7})
    assert line["finish_reason"] == "stop"


def test_a_bad_eos_field_is_named(cli, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(MIMO, folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": "two"}))
    code, _, err = cli("generate", "--model", folder, "--prompt-ids", "1")
    assert code == 2 and "generation_config.json: 'eos_token_id' must be an id" in err


def _long_context_demo(tmp_path, max_position):
    folder = tmp_path / "demo"
    shutil.copytree(DEMO_DIR, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = max_position
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_4096_token_prompt_runs_with_default_flags(cli, tmp_path):
    folder = _long_context_demo(tmp_path, 131_072)
    prompts = tmp_path / "p.jsonl"
    ids = [(7 * i) % 200 + 20 for i in range(4096)]
    prompts.write_text(json.dumps({"prompt_ids": ids}) + "\n")
    code, out, err = cli(
        "generate",
        "--model",
        folder,
        "--prompts-file",
        prompts,
        "--max-tokens",
        "4",
        "--json",
        "--ignore-eos",
    )
    assert code == 0, err
    line = json.loads(out.splitlines()[0])
    assert len(line["tokens"]) == 4 and line["finish_reason"] == "length"


def test_the_context_limit_is_the_models_and_names_its_flag(cli, tmp_path):
    folder = _long_context_demo(tmp_path, 96)
    ids = ",".join(["20"] * 100)
    code, _, err = cli("generate", "--model", folder, "--prompt-ids", ids)
    assert code == 2 and "exceeds the context limit 96" in err and "--context-length" in err
    code, out, err = cli(
        "generate",
        "--model",
        folder,
        "--prompt-ids",
        ids,
        "--context-length",
        "110",
        "--max-tokens",
        "2",
        "--json",
    )
    assert code == 0, err
    code, _, err = cli(
        "generate",
        "--model",
        folder,
        "--prompt-ids",
        ids,
        "--context-length",
        "110",
        "--max-tokens",
        "2",
        "--kv-budget-gib",
        "0.000115",
        "--swa-full-tokens-ratio",
        "1",
    )
    assert code == 2 and "cannot fit in the KV pools" in err and "--kv-budget-gib" in err


def test_logits_of_every_prompt_in_a_file(cli, tmp_path):
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
    code, _, err = cli("logits", "--prompts-file", path, "--out", tmp_path / "x.npy")
    assert code == 2 and "3 prompts need --out FILE.npz" in err
    code, out, err = cli("logits", "--prompts-file", path, "--out", tmp_path / "x.npz")
    assert code == 0, err
    got = np.load(tmp_path / "x.npz")
    for i, p in enumerate(prompts):
        single = tmp_path / f"{i}.npy"
        ids = ",".join(map(str, p))
        assert cli("logits", "--prompt-ids", ids, "--out", single)[0] == 0
        assert got[f"prompt_ids_{i}"].tolist() == p
        np.testing.assert_allclose(got[f"logits_{i}"], np.load(single), rtol=1e-5, atol=1e-5)


def test_a_missing_draft_folder_is_named_as_the_draft(cli):
    code, _, err = cli("generate", "--draft-model", "no/such/draft", "--prompt-ids", "1")
    assert code == 2 and "--draft-model must be 'tiny', a checkpoint folder or a hub id" in err


def _reading(command: str, path) -> list:
    """The argv of a command that reads `path` as its input file."""
    return {
        "generate": ["generate", "--prompts-file", str(path)],
        "simulate": [
            "simulate",
            "--preset",
            "tiny-hybrid",
            "--kv-budget-gib",
            "0.01",
            "--workload",
            str(path),
        ],
        "replay": ["replay", str(path)],
    }[command]


@pytest.mark.parametrize("command", ["generate", "simulate", "replay"])
def test_a_non_regular_input_is_refused_before_reading(cli, command, tmp_path):
    zero = tmp_path / "zero.jsonl"
    zero.symlink_to("/dev/zero")  # reads forever; a name the workload flag accepts
    code, _, err = cli(*_reading(command, zero))
    assert code == 2 and "zero.jsonl is not a regular file" in err


def test_deeply_nested_json_names_the_line(cli, tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps({"prompt_ids": [1]}) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    code, _, err = cli("generate", "--prompts-file", path)
    assert code == 2 and "deep.jsonl:2: JSON nested too deeply" in err


@pytest.mark.parametrize("command", ["generate", "simulate", "replay"])
def test_an_oversized_line_exits_in_seconds_under_a_memory_limit(tmp_path, command):
    """A 1 GiB line, generated on the fly (a FIFO would be refused; a sparse file costs no
    disk): each command stops at the line limit, naming the line, in a 3 GiB address space."""
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:
        f.truncate(1 << 30)  # a sparse 1 GiB line of NUL bytes, no newline
    argv = _reading(command, path)
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
    code = limit + "import sys; from swajax.cli.main import main; sys.exit(main(sys.argv[1:]))"
    env = dict(os.environ, SWAJAX_COMPILE_CACHE="off")
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 2, done.stderr
    assert "big.jsonl:1: the line is longer than" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
