"""`swajax generate` / `swajax logits`: the embedded default, fixtures, options, bad input."""

import json

import numpy as np
import pytest
from helpers import FIXTURES

FIXTURE = FIXTURES / "gpt_oss"
CASE = json.loads((FIXTURE / "greedy.json").read_text())
IDS = ",".join(map(str, CASE["prompt"]))


def test_embedded_default_generates_and_reports_memory(cli):
    code, out, _ = cli("generate", "--prompt", "Hello, sliding windows", "--max-new-tokens", "40")
    assert code == 0
    assert "memory: peak full" in out and "SWA KV freed" in out
    freed = int(out.split("SWA KV freed ")[1].split()[0])
    assert freed > 0  # 40 tokens past an 8-token window: out-of-window SWA KV went back


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--disable-hybrid-memory"],
        ["--no-prefix-cache"],
        ["--page-size", "1"],
        ["--dtype", "bfloat16"],  # this fixture's greedy tokens survive bf16 (test_models)
        ["--kv-dtype", "bf16"],
    ],
)
def test_checkpoint_greedy_matches_transformers(cli, flags):
    code, out, _ = cli(
        "generate",
        "--model",
        str(FIXTURE),
        "--prompt-ids",
        IDS,
        "--max-new-tokens",
        "8",
        "--json",
        *flags,
    )
    lines = [json.loads(x) for x in out.splitlines()]
    assert code == 0 and lines[0]["tokens"] == CASE["greedy"]
    assert len(lines[0]["logprobs"]) == 8 and all(lp <= 0 for lp in lines[0]["logprobs"])
    assert "summary" in lines[-1]


def test_batched_prompts_file(cli, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        json.dumps({"prompt_ids": CASE["prompt"]})
        + "\n"
        + json.dumps({"prompt_ids": CASE["prompt"][:10]})
        + "\n"
    )
    code, out, _ = cli(
        "generate",
        "--model",
        str(FIXTURE),
        "--prompts-file",
        str(path),
        "--max-new-tokens",
        "8",
        "--json",
    )
    lines = [json.loads(x) for x in out.splitlines()]
    assert code == 0 and len(lines) == 3 and lines[0]["tokens"] == CASE["greedy"]


def test_logits_match_the_fixture(cli, tmp_path):
    out = tmp_path / "logits.npy"
    code, _, _ = cli("logits", "--model", str(FIXTURE), "--prompt-ids", IDS, "--out", str(out))
    got, expected = np.load(out), np.load(FIXTURE / "logits.npy")
    assert code == 0 and got.shape == expected.shape
    assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) <= 1e-4


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--prompt", "a", "--prompt-ids", "1"], "one of"),
        (["--prompt-ids", "1,x"], "must be an integer, got 'x'"),
        (["--model", "no/such/dir"], "checkpoint directory"),
        (["--max-new-tokens", "0"], "--max-new-tokens: must be an integer in [1,"),
        (["--temperature", "-1"], "temperature"),
    ],
)
def test_bad_input(cli, argv, needle):
    code, out, err = cli("generate", *argv)
    assert code != 0 and needle in err and len(err.strip().splitlines()) == 1


def test_text_prompt_needs_a_tokenizer(cli):
    code, _, err = cli("generate", "--model", str(FIXTURE), "--prompt", "hi")
    assert code != 0 and "tokenizer.json" in err
