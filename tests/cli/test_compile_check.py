"""`swajax compile-check`: a model's step programs compiled by the TPU compiler for one chip
(libtpu's compile-only devices: no TPU, no weights read). A published preset at two of its
layers compiles in about a minute here, so the full run is `-m slow`; the refusals, which need
no compile, run by default."""

from __future__ import annotations

import json

import pytest

from swajax.cli.main import main


def _run(capsys, *argv):
    rc = main(["compile-check", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_weights_larger_than_the_chip_are_refused_with_the_numbers(capsys):
    rc, out, err = _run(capsys, "--preset", "gpt-oss-120b", "--slice", "v5e-1", "--json")
    assert rc == 1
    assert "60.87 GiB a chip, more than the 14.40 GiB usable on one v5e chip (0.9 of 16" in err
    assert json.loads(out)["fits"] is False


def test_a_hub_id_in_the_local_cache_is_read_as_shapes(capsys, tmp_path, monkeypatch):
    """--model takes a hub id from the huggingface_hub cache (offline; only config.json is
    read): gpt-oss-120b's config there is refused on one v5e chip with its numbers."""
    from huggingface_hub import constants
    from test_ecosystem_names import fake_hub_cache

    from swajax.presets import hf_preset

    source = tmp_path / "src"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(dict(hf_preset("gpt-oss-120b"))))
    fake_hub_cache(tmp_path / "hub", "openai/gpt-oss-120b", source)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc, _, err = _run(capsys, "--model", "openai/gpt-oss-120b", "--slice", "v5e-1")
    assert rc == 1 and "openai/gpt-oss-120b's weights take 60.87 GiB a chip" in err
    rc, _, err = _run(capsys, "--model", "openai/not-cached", "--slice", "v5e-1")
    assert rc == 2 and "not in the local Hugging Face cache" in err


def test_no_tpu_compiler_is_a_clear_error(capsys, monkeypatch):
    from swajax import tpu

    monkeypatch.setattr(tpu.importlib.util, "find_spec", lambda name: None)
    rc, _, err = _run(capsys, "--preset", "gpt-oss-20b", "--slice", "v6e-1")
    assert rc == 2 and "the TPU compiler (libtpu) is not installed: pip install 'jax[tpu]==" in err


@pytest.mark.parametrize(
    "argv, said",
    [
        (("--slice", "v4-8"), "unknown TPU slice 'v4-8'"),
        (("--slice", "v6e-3"), "v6e slices here are v6e-1, v6e-4, v6e-8, v6e-16"),
        (("--slice", "v6e-3", "--batch", "0"), "--batch: must be"),
        (("--slice", "v6e-1", "--memory-fraction", "1.5"), "memory fraction 1.5 must be in"),
        (("--slice", "v6e-1", "--layers", "99"), "--layers: 99 layers is more than the model's 24"),
    ],
)
def test_bad_input_is_one_line_naming_the_value(capsys, argv, said):
    rc, _, err = _run(capsys, "--preset", "gpt-oss-20b", *argv)
    assert rc == 2 and said in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_published_preset_compiles_and_fits_one_chip(capsys):
    rc, out, err = _run(
        capsys,
        *("--preset", "gpt-oss-20b", "--layers", "2", "--slice", "v6e-1", "--batch", "8"),
        *("--memory-fraction", "0.2", "--context-length", "4096", "--json"),
    )
    assert rc == 0, err
    report = json.loads(out)
    assert report["fits"] and report["slice"] == "v6e-1"
    assert [(p["name"], p["rows"]) for p in report["programs"]] == [
        ("prefill", 1),
        ("decode", 1),
        ("decode", 8),
    ]
    for p in report["programs"]:
        # the arguments hold the weights and both pools; the peak is memory_analysis' sum
        assert p["argument_bytes"] >= report["weight_bytes"] + report["pool_bytes"]
        peak = p["argument_bytes"] + p["output_bytes"] - p["alias_bytes"] + p["temp_bytes"]
        assert p["peak_bytes"] == peak <= report["hbm_bytes"]
    decode = report["programs"][1]
    assert decode["bandwidth_seconds"] >= decode["roofline_seconds"] > 0  # weights and more
    assert report["figures"]["seconds"] == "modeled by XLA's TPU cost model"


def test_a_slice_of_four_chips_compiles_split_over_them():
    """Tensor parallel over a v5e 2x2 slice (gpt-oss-20b's widths, two layers): the weights and
    the pools split over the four chips as the engine splits them, the donated pools aliased
    (the program writes them in place), and every figure per chip."""
    from helpers.published import published_config

    from swajax.api.compile_check import compile_check

    report = compile_check(
        published_config(layers=2),
        "v5e-4",
        name="gpt-oss-20b",
        batch=1,
        memory_fraction=0.3,
        max_context=4096,
        temporaries=2**30,  # one compile of each program, not a first to measure them
    )
    assert report.chips == 4 and report.fits
    kv_per_token = 2 * 8 * 64 * 2  # K and V, 8 KV heads of 64, bfloat16: a quarter a chip
    pool_tokens = report.full_tokens + report.swa_tokens
    assert report.pool_bytes <= pool_tokens * kv_per_token // 4 * 1.05
    for p in report.programs:
        assert p.alias_bytes >= report.pool_bytes > 2**28
        assert p.argument_bytes >= report.weight_bytes + report.pool_bytes


@pytest.mark.slow
def test_llama_4_scouts_bfloat16_experts_compile():
    """Llama 4 Scout at two of its layers on one v5p chip: its bfloat16 routed experts
    (`lax.ragged_dot`) and chunked attention compile (they once stopped at Mosaic's "Bad lhs
    type"), and it fits."""
    from swajax.api.compile_check import compile_check
    from swajax.presets import at_depth, hf_preset

    cfg = at_depth(hf_preset("llama-4-scout"), 2)
    report = compile_check(cfg, "v5p-2", name="llama-4-scout", batch=1, max_context=8192)
    assert report.fits and report.full_tokens >= 8192


@pytest.mark.slow  # a dozen compiles of 10-20 s each here
def test_warm_up_compiles_every_fixed_shape_program(capsys, tmp_path):
    """--warm-up adds every step program a server's warm-up makes at the checked sizes (each
    prefill chunk and decode batch the scheduler can reach), each compiled for the chip, and
    the verdict counts the largest. gpt-oss's layer kinds and head width over narrower layers."""
    from helpers.published import narrowed_config

    cfg = narrowed_config()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    argv = ["--hf-config", str(tmp_path / "config.json"), "--slice", "v6e-1", "--batch", "4"]
    rc, out, err = _run(capsys, *argv, "--context-length", "2048", "--warm-up", "--json")
    assert rc == 0, err
    report = json.loads(out)
    warm = [p for p in report["programs"] if p["name"].startswith("warm-up")]
    kinds = {p["name"].split()[1] for p in warm}
    assert kinds == {"prefill", "decode"} and len(warm) >= 8, [p["name"] for p in warm]
    assert {p["rows"] for p in warm} == {4}  # fixed shapes pad to the running limit
    assert len({p["name"] for p in warm}) == len(warm)  # each variant reported apart
    assert report["peak_bytes"] == max(p["peak_bytes"] for p in report["programs"])
    assert report["fits"]
