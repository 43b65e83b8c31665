"""`swajax generate` / `swajax logits`: the embedded default, fixtures, options, bad input."""

import json

import numpy as np
import pytest
from helpers import FIXTURES

FIXTURE = FIXTURES / "gpt_oss"
CASE = json.loads((FIXTURE / "greedy.json").read_text())
IDS = ",".join(map(str, CASE["prompt"]))


def test_embedded_default_generates_and_reports_memory(cli):
    code, out, _ = cli("generate", "--prompt", "def fibonacci(n):", "--max-tokens", "100")
    assert code == 0
    assert "memory: peak full" in out and "SWA KV freed" in out
    freed = int(out.split("SWA KV freed ")[1].split()[0])
    assert freed > 0  # 117 tokens past a 64-byte window: out-of-window SWA KV went back


@pytest.mark.parametrize(
    "flags",
    [
        [],
        # Memory settings never change outputs (tests/serving/test_equivalence.py); that these
        # flags reach the engine is checked with -m slow.
        pytest.param(["--disable-hybrid-swa-memory"], marks=pytest.mark.slow),
        pytest.param(["--disable-radix-cache"], marks=pytest.mark.slow),
        pytest.param(["--page-size", "1"], marks=pytest.mark.slow),
        ["--dtype", "bfloat16", "--kv-cache-dtype", "fp32"],  # greedy survives bf16 (test_models)
        ["--draft-model", str(FIXTURES / "qwen3"), "--num-speculative-tokens", "3"],
        ["--no-overlap"],
        ["--decode-steps", "1"],  # plain steps (rounds of 8 are the default)
        # every layer traced on its own (the default scans S F x 2): scanned and unrolled runs
        # agree in tests/models/test_models.py
        pytest.param(["--unroll-layers"], marks=pytest.mark.slow),
        ["--deterministic"],
    ],
)
def test_checkpoint_greedy_matches_transformers(cli, flags):
    code, out, _ = cli(
        "generate",
        "--model",
        str(FIXTURE),
        "--prompt-ids",
        IDS,
        "--max-tokens",
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
        "--max-tokens",
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
        (["--model", "no/such-dir"], "not in the local Hugging Face cache"),
        (["--model", "./no/such/dir"], "a checkpoint folder or a hub id"),
        (["--max-tokens", "0"], "--max-tokens: must be an integer in [1,"),
        (["--temperature", "-1"], "temperature"),
        (["--num-speculative-tokens", "2"], "(--speculative-num-steps) needs a draft"),
        (["--speculative-config", "{method: mtp}"], "--speculative-config: not JSON"),
        (["--speculative-config", '{"method": "mtp", "k": 2}'], "got ['k']"),
        (["--speculative-config", '{"num_speculative_tokens": 0}'], "in [1, 64], got 0"),
        (["--speculative-algorithm", "ngram"], "'ngram' needs a draft model"),
        (["--decode-steps", "0"], "--decode-steps: must be an integer in [1,"),
    ],
)
def test_bad_input(cli, argv, needle):
    code, out, err = cli("generate", *argv)
    assert code != 0 and needle in err and len(err.strip().splitlines()) == 1


def test_text_prompt_needs_a_tokenizer(cli):
    code, _, err = cli("generate", "--model", str(FIXTURE), "--prompt", "hi")
    assert code != 0 and "tokenizer.json" in err


def _with_tokenizer(tmp_path, template=True):
    """The gpt_oss fixture plus a word-level tokenizer.json (special tokens added) and a chat
    template in tokenizer_config.json."""
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = tmp_path / "chat"
    shutil.copytree(FIXTURE, folder)
    words = ["<unk>", "hello", "sliding", "windows", "again"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "<|user|>", "<|end|>", "<|assistant|>"])  # ids 5..8
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": {"content": "<s>"}, "eos_token": "<|end|>"}
    if template:
        config["chat_template"] = (
            "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
        )
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_chat_template_wraps_a_text_prompt(cli, tmp_path):
    folder = _with_tokenizer(tmp_path)
    args = ["generate", "--model", folder, "--max-tokens", "2", "--json"]
    code, out, _ = cli(*args, "--prompt", "hello sliding windows")
    assert code == 0 and json.loads(out.splitlines()[0])["prompt_ids"] == [1, 2, 3]
    code, out, _ = cli(*args, "--prompt", "hello sliding windows", "--chat")
    assert code == 0 and json.loads(out.splitlines()[0])["prompt_ids"] == [5, 6, 1, 2, 3, 7, 8]


def test_chat_without_a_template_is_an_error(cli, tmp_path):
    folder = _with_tokenizer(tmp_path, template=False)
    code, _, err = cli("generate", "--model", folder, "--prompt", "hello", "--chat")
    assert code == 2 and "no chat template" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("generate", "--prompt", "hello", "--chat")  # the embedded model
    assert code == 2 and "no chat template" in err


def test_a_missing_hf_extra_is_named(cli, tmp_path, monkeypatch):
    import sys

    folder = _with_tokenizer(tmp_path)
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails as if not installed
    code, _, err = cli("generate", "--model", folder, "--prompt", "hello")
    assert code != 0 and "swajax[hf]" in err and len(err.strip().splitlines()) == 1


def test_sampling_flags_reach_every_sample(cli):
    """--n samples per prompt (sharing its prefill), --stop cuts the text, --logprobs ranks."""
    code, out, _ = cli(
        "generate",
        "--prompt",
        "def fibonacci(n):",
        "--max-tokens",
        "24",
        "--temperature",
        "0.9",
        "--top-k",
        "30",
        "--min-p",
        "0.01",
        "--repetition-penalty",
        "1.2",
        "--frequency-penalty",
        "0.3",
        "--n",
        "3",
        "--stop",
        "\n\n",
        "--logprobs",
        "2",
        "--json",
    )
    assert code == 0
    *lines, summary = [json.loads(x) for x in out.splitlines()]
    assert [x["sample"] for x in lines] == [0, 1, 2]
    assert summary["summary"]["prefix_hit_tokens"] > 0  # samples 2 and 3 reuse the prompt
    for line in lines:
        assert "\n\n" not in line["text"]
        assert len(line["top_logprobs"]) == len(line["tokens"])
        assert all(len(top) == 2 for top in line["top_logprobs"])
    code, out, _ = cli("generate", "--prompt", "x", "--n", "2", "--max-tokens", "2")
    assert code == 0 and "=== prompt 1 of 1, sample 2 of 2 ===" in out


def test_serve_without_its_extra_names_it(cli, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import fails as if not installed
    code, _, err = cli("serve", "--port", "0")
    assert code == 2 and "swajax[serve]" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("steps", [None, "1", "16"])
def test_serve_takes_the_multi_step_setting(steps):
    """`swajax serve --decode-steps N` reaches the engine's options (absent: the runner's
    default, rounds of 8 for a model)."""
    from swajax.cli.generate import engine_fields
    from swajax.cli.main import build_parser

    argv = ["serve", *(["--decode-steps", steps] if steps else [])]
    fields = engine_fields(build_parser().parse_args(argv))
    assert fields.get("decode_steps") == (int(steps) if steps else None)


def test_serve_refuses_a_bad_multi_step_setting(cli):
    code, _, err = cli("serve", "--decode-steps", "0")
    assert code == 2 and "--decode-steps" in err


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], (None, 0)),
        (["--draft-model", "mtp"], ("mtp", 4)),
        (["--speculative-algorithm", "MTP", "--speculative-num-steps", "2"], ("mtp", 2)),
        (["--speculative-algorithm", "eagle", "--speculative-num-draft-tokens", "4"], ("mtp", 3)),
        (["--speculative-draft-model-path", "d", "--speculative-algorithm", "eagle"], ("d", 4)),
        (
            ["--speculative-config", '{"method": "deepseek_mtp", "num_speculative_tokens": 1}'],
            ("mtp", 1),
        ),
        (["--speculative-config", '{"model": "d", "num_speculative_tokens": 3}'], ("d", 3)),
    ],
)
def test_speculative_flags_in_every_spelling(argv, expected):
    """swajax's, SGLang's and vLLM's ways of naming a draft and its length mean the same."""
    import argparse

    from swajax.cli.generate import add_speculative, speculative

    parser = argparse.ArgumentParser()
    add_speculative(parser)
    assert speculative(parser.parse_args(argv)) == expected


def test_generate_with_mtp_reports_acceptance(cli):
    """The demo with its own MTP layer and its own generation_config (a penalty, sampling)."""
    code, out, _ = cli("generate", "--draft-model", "mtp", "--prompt", "def fibonacci(n):")
    assert code == 0
    kept, proposed = (int(x) for x in out.split("speculative: ")[1].split()[:3:2])
    assert 0 < kept <= proposed and "tokens per round" in out
