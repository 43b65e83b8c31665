"""`swajax plan`: JSON fields, the capacity ratio against the formula, one-line errors."""

import json
import subprocess
import sys

import pytest


def test_plan_json_mimo_capacity_ratio(cli):
    code, out, _ = cli(
        "plan",
        "--preset",
        "mimo-v2-flash",
        "--kv-budget-gib",
        "10",
        "--swa-full-tokens-ratio",
        "0.05",
        "--json",
        "--avg-seq-len",
        "16384",
    )
    assert code == 0
    report = json.loads(out)
    # Per token and layer: full 4 heads x (192 + 128) x 2 B = F; SWA 8 heads = 2F.
    f = 4 * (192 + 128) * 2
    budget = 10 * 2**30
    full = budget // (9 * f + 0.05 * 39 * 2 * f)
    single = budget // (9 * f + 39 * 2 * f)
    assert report["full_tokens"] == int(full)
    assert report["swa_tokens"] == int(int(full) * 0.05)
    assert report["single_pool_tokens"] == single
    assert report["capacity_ratio"] == pytest.approx(full / single, rel=1e-5)
    assert report["full_bytes_per_token"] == 9 * f
    assert report["swa_bytes_per_token"] == 39 * 2 * f
    assert report["bytes_used"] <= budget
    assert report["min_ratio_estimate"] == pytest.approx((128 + 128 + 1) / 16384)


def test_plan_human_table(cli):
    code, out, _ = cli(
        "plan", "--preset", "gpt-oss-120b", "--kv-budget-gib", "4", "--page-size", "16"
    )
    assert code == 0
    assert "full pool tokens" in out and "capacity vs single" in out


def test_plan_hf_config_and_single_pool(cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "gemma3_text",
                "num_hidden_layers": 6,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "sliding_window": 32,
            }
        )
    )
    code, out, _ = cli(
        "plan",
        "--hf-config",
        str(path),
        "--kv-budget-gib",
        "0.01",
        "--disable-hybrid-swa-memory",
        "--json",
    )
    report = json.loads(out)
    assert code == 0 and report["mode"] == "single" and report["capacity_ratio"] == 1.0


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            [
                "--preset",
                "mimo-v2-flash",
                "--kv-budget-gib",
                "10",
                "--swa-full-tokens-ratio",
                "1.5",
            ],
            "1.5",
        ),
        (["--preset", "mimo-v2-flash", "--kv-budget-gib", "-2"], "got -2"),
        (["--preset", "no-such-model", "--kv-budget-gib", "1"], "no-such-model"),
        (["--kv-budget-gib", "1"], "--preset"),
        (
            [
                "--preset",
                "gpt-oss-20b",
                "--kv-budget-gib",
                "1",
                "--swa-full-tokens-ratio",
                "0.004",
                "--page-size",
                "64",
            ],
            "W + page_size",
        ),
        (["--hf-config", "/nonexistent/config.json", "--kv-budget-gib", "1"], "no config file"),
    ],
)
def test_plan_bad_arguments(cli, argv, needle):
    code, out, err = cli("plan", *argv)
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_console_entry_point_runs():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "swajax",
            "plan",
            "--preset",
            "tiny-hybrid",
            "--kv-budget-gib",
            "0.001",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["mode"] == "hybrid"


@pytest.mark.parametrize(
    "preset", ["gemma-4-31b", "gemma-4-26b-a4b", "step-3.5-flash", "deepseek-v4-flash"]
)
def test_plan_reads_the_new_families_published_configs(cli, tmp_path, preset):
    """`plan --hf-config` on the published configs' attention fields (the presets, written out
    as config.json) gives what the preset gives."""
    from swajax.presets import hf_preset

    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf_preset(preset)))
    by_file = cli("plan", "--hf-config", str(path), "--kv-budget-gib", "40", "--json")
    by_name = cli("plan", "--preset", preset, "--kv-budget-gib", "40", "--json")
    assert by_file[0] == 0 and by_file[1] == by_name[1]
    report = json.loads(by_file[1])
    assert (report["compressed_bytes_per_token"] > 0) == (preset == "deepseek-v4-flash")


def test_plan_with_a_draft_model(cli):
    code, out, _ = cli(
        "plan",
        "--preset",
        "gpt-oss-120b",
        "--kv-budget-gib",
        "40",
        "--swa-full-tokens-ratio",
        "0.5",
        "--draft-preset",
        "gpt-oss-20b",
        "--json",
    )
    assert code == 0 and json.loads(out)["full_tokens"] == 466_033  # tests/test_sizing.py
    code, _, err = cli(
        "plan", "--preset", "gpt-oss-120b", "--kv-budget-gib", "40", "--draft-preset", "nope"
    )
    assert code == 2 and "unknown preset 'nope'" in err
