"""Config parsing: per-layer kinds for every family, window conventions, errors."""

import json

import pytest

from swajax.config import ConfigError, LayerKind, load_hf_config, parse_hf_config
from swajax.presets import load_preset

BASE = dict(
    hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128
)


def cfg(model_type, n, **kw):
    return parse_hf_config({"model_type": model_type, "num_hidden_layers": n, **BASE, **kw})


def types(kinds: str) -> list[str]:
    names = {"S": "sliding_attention", "F": "full_attention", "C": "chunked_attention"}
    return [names[k] for k in kinds]


@pytest.mark.parametrize(
    "model_type, n, fields, kinds, window",
    [
        ("gpt_oss", 8, dict(sliding_window=128), "SFSFSFSF", 127),
        ("gemma2", 6, dict(sliding_window=4096), "SFSFSF", 4095),
        ("gemma3_text", 12, dict(sliding_window=1024), "SSSSSFSSSSSF", 1023),
        ("gemma3_text", 8, dict(sliding_window=1024, sliding_window_pattern=4), "SSSFSSSF", 1023),
        ("gemma4_text", 8, dict(sliding_window=512), "SSSSSFSF", 511),
        (
            "qwen3",
            8,
            dict(use_sliding_window=True, sliding_window=8, max_window_layers=3),
            "FFFSSSSS",
            7,
        ),
        (
            "qwen2",
            4,
            dict(use_sliding_window=True, sliding_window=8, max_window_layers=0),
            "SSSS",
            7,
        ),
        (
            "qwen3",
            4,
            dict(use_sliding_window=False, sliding_window=8, max_window_layers=0),
            "FFFF",
            None,
        ),
        ("mistral", 4, dict(sliding_window=4096), "SSSS", 4095),
        ("mistral", 3, dict(sliding_window=None), "FFF", None),
        ("cohere2", 8, dict(sliding_window=4096), "SSSFSSSF", 4095),
        ("olmo3", 8, dict(sliding_window=4096), "SSSFSSSF", 4095),
        ("exaone4", 8, dict(sliding_window=4096, sliding_window_pattern=4), "SSSFSSSF", 4095),
        ("step3p5", 4, dict(sliding_window=512, layer_types=types("SFSF")), "SFSF", 511),
        ("step3p5", 3, dict(sliding_window=512), "FFF", None),
        ("mimo_v2_flash", 8, dict(sliding_window_size=128), "FSSSSFSS", 128),
        ("llama4_text", 8, dict(attention_chunk_size=8192), "CCCFCCCF", 8192),
        ("llama4_text", 2, dict(attention_chunk_size=4, no_rope_layers=[1, 0]), "CF", 4),
        # transformers' default attention_chunk_size (8192) when the config names none
        ("llama4_text", 4, dict(no_rope_layers=[1, 1, 1, 0]), "CCCF", 8192),
        ("gpt_oss", 4, {}, "SFSF", 127),  # transformers' default sliding_window (128)
        ("brand_new_model", 4, dict(sliding_window=9, layer_types=types("SSFS")), "SSFS", 8),
    ],
)
def test_family_layer_kinds(model_type, n, fields, kinds, window):
    c = cfg(model_type, n, **fields)
    assert c.kinds == kinds
    assert c.sliding_window == window
    assert c.swa_layer_ids == tuple(i for i, k in enumerate(kinds) if k != "F")
    assert c.full_layer_ids == tuple(i for i, k in enumerate(kinds) if k == "F")


def test_modes():
    assert cfg("gpt_oss", 4, sliding_window=8).layer_mix == "hybrid"
    assert cfg("mistral", 4, sliding_window=8).layer_mix == "all_swa"
    assert cfg("qwen3", 4, use_sliding_window=False).layer_mix == "full_only"
    # No allowlist: Gemma 2/3 are hybrid here (SGLang forces them to one pool).
    assert cfg("gemma3_text", 12, sliding_window=1024).is_hybrid


def test_mimo_both_window_forms_agree():
    hub = cfg("mimo_v2_flash", 6, sliding_window_size=128, hybrid_layer_pattern=[0, 1, 1, 1, 1, 0])
    converted = cfg("mimo_v2_flash", 6, sliding_window=129, layer_types=types("FSSSSF"))
    assert hub.kinds == converted.kinds == "FSSSSF"
    assert hub.sliding_window == converted.sliding_window == 128


def test_mimo_preset_shapes():
    c = load_preset("mimo-v2-flash")
    assert (len(c.swa_layer_ids), len(c.full_layer_ids)) == (39, 9)
    assert c.full_layer_ids == (0, 5, 11, 17, 23, 29, 35, 41, 47)
    assert (c.swa_attention.num_kv_heads, c.full_attention.num_kv_heads) == (8, 4)
    assert (c.swa_attention.head_dim, c.swa_attention.v_head_dim) == (192, 128)
    assert c.swa_attention.has_sinks and not c.full_attention.has_sinks
    # The transformers port gives SWA layers twice the KV heads without swa_* fields.
    port = cfg("mimo_v2_flash", 2, sliding_window=5, layer_types=types("SF"))
    assert port.swa_attention.num_kv_heads == 2 * port.full_attention.num_kv_heads


def test_gpt_oss_sinks_every_layer():
    c = load_preset("gpt-oss-120b")
    assert c.kinds == "SF" * 18 and c.sliding_window == 127
    assert c.full_attention.has_sinks and c.swa_attention.has_sinks
    assert c.full_attention.num_kv_heads == 8 and c.full_attention.head_dim == 64


def test_llama4_nested_text_config_and_nope_layers():
    c = load_preset("llama-4-scout")
    assert c.kinds == "CCCF" * 12 and c.sliding_window == 8192
    assert all(not c.layers[i].uses_rope for i in c.full_layer_ids)
    assert all(
        c.layers[i].uses_rope and c.layers[i].kind is LayerKind.CHUNKED for i in c.swa_layer_ids
    )


def test_gemma_presets_and_gemma4_full_shapes():
    c = load_preset("gemma-3-27b")
    assert len(c.layers) == 62 and c.kinds.count("F") == 10 and c.sliding_window == 1023
    g4 = cfg(
        "gemma4_text",
        6,
        sliding_window=512,
        num_global_key_value_heads=1,
        global_head_dim=64,
        attention_k_eq_v=True,
    )
    assert g4.kinds == "SSSSSF"
    assert (g4.full_attention.num_kv_heads, g4.full_attention.head_dim) == (1, 64)
    assert g4.full_attention.k_is_v and not g4.swa_attention.k_is_v
    assert (g4.swa_attention.num_kv_heads, g4.swa_attention.head_dim) == (2, 16)
    # transformers' rule: the global KV head count applies only where keys are values
    plain = cfg("gemma4_text", 6, sliding_window=512, num_global_key_value_heads=1)
    assert (plain.full_attention.num_kv_heads, plain.full_attention.head_dim) == (2, 512)
    assert not plain.full_attention.k_is_v


def test_rope_legacy_and_v5_forms():
    legacy = cfg(
        "gemma3_text",
        6,
        sliding_window=8,
        rope_theta=1e6,
        rope_local_base_freq=1e4,
        rope_scaling={"rope_type": "linear", "factor": 8.0},  # the global layers' only
    )
    v5 = cfg(
        "gemma3_text",
        6,
        sliding_window=8,
        layer_types=types("SSSSSF"),
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
        },
    )
    assert legacy.layers == v5.layers
    assert [layer.rope_theta for layer in v5.layers] == [1e4] * 5 + [1e6]
    assert [dict(layer.rope_params).get("factor") for layer in legacy.layers] == [None] * 5 + [8.0]
    flat = cfg("qwen3", 2, rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    assert flat.layers[0].rope_theta == 5e5


def test_layer_types_present_or_derived_agree():
    derived = cfg("gpt_oss", 6, sliding_window=128)
    present = cfg("gpt_oss", 6, sliding_window=128, layer_types=types("SFSFSF"))
    assert derived.layers == present.layers


def test_load_from_file_and_dir(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gpt_oss", "num_hidden_layers": 2, **BASE, "sliding_window": 4})
    )
    assert load_hf_config(tmp_path).kinds == "SF"
    assert load_hf_config(tmp_path / "config.json").sliding_window == 3


@pytest.mark.parametrize(
    "config, field",
    [
        ({"model_type": "gpt_oss", **BASE, "sliding_window": 4}, "num_hidden_layers"),
        (
            {"model_type": "mystery", "num_hidden_layers": 2, **BASE, "sliding_window": 4},
            "layer_types",
        ),
        (
            {
                "model_type": "gpt_oss",
                "num_hidden_layers": 2,
                **BASE,
                "layer_types": ["sliding_attention", "linear_attention"],
                "sliding_window": 4,
            },
            "layer_types[1]",
        ),
        (
            {
                "model_type": "brand_new_model",
                "num_hidden_layers": 2,
                **BASE,
                "layer_types": ["sliding_attention", "full_attention"],
            },
            "sliding_window",
        ),
        (
            {"model_type": "gpt_oss", "num_hidden_layers": 2, **BASE, "sliding_window": 1},
            "sliding_window",
        ),
        (
            {
                "model_type": "mimo_v2_flash",
                "num_hidden_layers": 3,
                **BASE,
                "sliding_window_size": 4,
                "hybrid_layer_pattern": [0, 1],
            },
            "hybrid_layer_pattern",
        ),
        (
            {
                "model_type": "llama4_text",
                "num_hidden_layers": 2,
                **BASE,
                "attention_chunk_size": 0,
            },
            "attention_chunk_size",
        ),
        (
            {
                "model_type": "gpt_oss",
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_key_value_heads": 3,
                "sliding_window": 4,
            },
            "num_kv_heads=3",
        ),
        ({"num_hidden_layers": 2}, "model_type"),
    ],
)
def test_errors_name_the_field(config, field):
    with pytest.raises(ConfigError, match=__import__("re").escape(field)):
        parse_hf_config(config)


def test_missing_file_error(tmp_path):
    with pytest.raises(ConfigError, match="no config file"):
        load_hf_config(tmp_path)


def test_new_family_presets_by_hand():
    """Published attention fields of Gemma 4, Step-3.5-Flash and DeepSeek-V4 (swajax.presets);
    bytes per token in bf16, counted by hand."""
    from swajax import sizing

    g31 = load_preset("gemma-4-31b")
    assert g31.kinds == "SSSSSF" * 10 and g31.sliding_window == 1023
    # full: 10 layers x 4 KV heads x 512, stored once (keys are values); SWA: 50 x 16 x (256 + 256)
    assert sizing.token_bytes(g31, "bf16") == (10 * 4 * 512 * 2, 50 * 16 * 512 * 2)
    moe = load_preset("gemma-4-26b-a4b")
    assert sizing.token_bytes(moe, "bf16") == (5 * 2 * 512 * 2, 25 * 8 * 512 * 2)
    e4b = load_preset("gemma-4-e4b")  # layers 24-41 read layers 22 and 23's KV
    assert e4b.layers[41].kv_source == 23 and e4b.layers[24].kv_source == 22
    assert len(e4b.full_layer_ids) == 4 and len(e4b.swa_layer_ids) == 20
    assert sizing.token_bytes(e4b, "bf16") == (4 * 2 * 1024 * 2, 20 * 2 * 512 * 2)
    step = load_preset("step-3.5-flash")
    assert step.kinds == ("FSSS" * 12)[:45] and step.sliding_window == 511
    assert (step.swa_attention.num_heads, step.full_attention.num_heads) == (96, 64)
    assert step.swa_attention.num_kv_heads == step.full_attention.num_kv_heads == 8
    ds = load_preset("deepseek-v4-flash")
    # Compressed entries live as long as the request, on the full pages: hybrid pools
    assert ds.layer_mix == "hybrid" and ds.sliding_window == 127 and not ds.full_layer_ids
    assert ds.swa_attention.k_is_v and ds.swa_attention.has_sinks
    rates = [la.compress_rate for la in ds.layers]
    assert rates[:4] == [None, None, 4, 128] and rates.count(4) == 21 and rates.count(128) == 20
    # CSA: (512 KV + 128 indexer) every 4 tokens; HCA: 512 every 128 tokens
    assert ds.compressed_bytes_per_token(2) == 21 * 640 * 2 / 4 + 20 * 512 * 2 / 128


def test_deepseek_v4_layer_types_and_rates_forms():
    base = {
        "model_type": "deepseek_v4",
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "sliding_window": 16,
        "index_head_dim": 8,
    }
    csa, hca = "compressed_sparse_attention", "heavily_compressed_attention"
    new = parse_hf_config(
        base
        | {"layer_types": ["sliding_attention", csa, hca, csa], "compress_rates": {csa: 2, hca: 16}}
    )
    legacy = parse_hf_config(
        base
        | {"compress_ratios": [0, 2, 16, 2, 0], "compress_rate_csa": 2, "compress_rate_hca": 16}
    )
    assert new == legacy
    assert [la.compress_rate for la in new.layers] == [None, 2, 16, 2]
    assert [la.compress_dims for la in new.layers] == [0, 40, 32, 40]
    assert [la.pending_dims for la in new.layers] == [0, 160, 64, 160]  # CSA: two series
    with pytest.raises(ConfigError, match="compress_ratios"):
        parse_hf_config(base | {"compress_ratios": [0, 3, 16, 2]})
    with pytest.raises(ConfigError, match="layer_types"):
        parse_hf_config(base | {"layer_types": ["sliding_attention", "full_attention"] * 2})
