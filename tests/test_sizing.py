"""Pool sizing: the seed's MiMo-V2-Flash arithmetic and SGLang's configurator scenarios (§12.6)."""

import re

import pytest

from swajax import sizing
from swajax.config import parse_hf_config
from swajax.presets import load_preset
from swajax.sizing import ChunkCap, SizingError, Speculative


def model(n_full, n_swa, window=4, kv_heads=4, head_dim=64):
    """A generic hybrid config: full layers first, then SWA layers."""
    layer_types = ["full_attention"] * n_full + ["sliding_attention"] * n_swa
    return parse_hf_config(
        {
            "model_type": "test",
            "num_hidden_layers": n_full + n_swa,
            "hidden_size": 256,
            "num_attention_heads": kv_heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "layer_types": layer_types,
            "sliding_window": window + 1,
        }
    )


def test_mimo_seed_arithmetic():
    cfg = load_preset("mimo-v2-flash")
    f, s = sizing.layer_bytes(cfg, "bf16")
    assert s == 2 * f  # 8 vs 4 KV heads, same head dims
    assert sizing.cell_bytes(cfg, 0.8, "bf16") / f == pytest.approx(71.4)
    assert sizing.cell_bytes(cfg, 0.05, "bf16") / f == pytest.approx(12.9)
    budget = 10 * 2**30
    at_08 = sizing.size_hybrid(cfg, budget, ratio=0.8, page_size=1, dtype="bf16")
    at_005 = sizing.size_hybrid(cfg, budget, ratio=0.05, page_size=1, dtype="bf16")
    assert at_005.full_tokens / at_08.full_tokens == pytest.approx(71.4 / 12.9, rel=1e-4)
    assert round(at_005.full_tokens / at_08.full_tokens, 1) == 5.5


B = 10_000_000
HYBRID = model(16, 16)  # 4 heads x (64 + 64) x 2 bytes = 1 KiB per token per layer


def test_hybrid_uses_the_budget():
    sizes = sizing.size_hybrid(HYBRID, B, ratio=0.5, page_size=1, dtype="bf16")
    used = sizing.bytes_used(HYBRID, sizes, "bf16")
    assert 0.99 * B < used <= B
    assert sizes.max_total_tokens == sizes.full_tokens


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75, 1.0])
def test_ratio_sets_swa(ratio):
    sizes = sizing.size_hybrid(HYBRID, B, ratio=ratio, page_size=1, dtype="bf16")
    assert sizes.swa_tokens == int(sizes.full_tokens * ratio)


def test_page_alignment():
    # 4x the budget: at 1e7 bytes the page-aligned SWA pool would not clear W + 128.
    sizes = sizing.size_hybrid(HYBRID, 4 * B, ratio=0.5, page_size=128, dtype="bf16")
    assert sizes.full_tokens % 128 == 0
    assert sizes.swa_tokens == int(sizes.full_tokens * 0.5) // 128 * 128


def test_constraint_path_caps_the_full_pool():
    sizes = sizing.solve_pool_sizes(HYBRID, 200, ratio=0.5, page_size=1)
    assert (sizes.full_tokens, sizes.swa_tokens) == (200, 100)
    half = sizing.solve_pool_sizes(HYBRID, 100, ratio=0.5, page_size=1)
    ratio = sizing.bytes_used(HYBRID, half, "bf16") / sizing.bytes_used(HYBRID, sizes, "bf16")
    assert ratio == pytest.approx(0.5, rel=0.01)


def test_asymmetric_layer_counts():
    cfg = model(24, 8)
    sizes = sizing.size_hybrid(cfg, B, ratio=0.5, page_size=1, dtype="bf16")
    assert sizes.swa_tokens == int(sizes.full_tokens * 0.5)
    assert sizing.bytes_used(cfg, sizes, "bf16") <= B


def test_all_swa_ignores_ratio():
    cfg = model(0, 32)
    for ratio in (0.1, 1.0):
        sizes = sizing.size_hybrid(cfg, B, ratio=ratio, page_size=1, dtype="bf16")
        assert sizes.full_tokens == 0 and sizes.max_total_tokens == sizes.swa_tokens
        assert 0.99 * B < sizing.bytes_used(cfg, sizes, "bf16") <= B
    sizes = sizing.solve_pool_sizes(cfg, 500, ratio=0.3, page_size=1)
    assert sizes.max_total_tokens == sizes.swa_tokens == 500


def test_single_pool_every_layer_every_token():
    sizes = sizing.size_single_pool(HYBRID, B, page_size=1, dtype="bf16")
    assert sizes.full_tokens == sizes.swa_tokens == B // (32 * 1024)


# Chunk cap (1 full + 1 SWA layer, eviction interval 4, 1e6 bytes): spec §12.6.
@pytest.mark.parametrize(
    "window, ps, cap, expected",
    [
        (8, 4, ChunkCap(2, 4, 4, overlap=False, speculative=Speculative(3, 2, 5)), 104),
        (8, 1, ChunkCap(2, 4, 4, overlap=True, speculative=Speculative(3, 2, 5)), 91),
        (4, 1, ChunkCap(10, 1000, 4, pd_decode_extra_slots=0), 100),
        (4, 1, ChunkCap(10, 1000, 4, pd_decode_extra_slots=2), 110),
        (8, 4, ChunkCap(2, 16, 4, overlap=True), 76),
    ],
)
def test_chunk_cap(window, ps, cap, expected):
    cfg = model(1, 1, window=window)
    sizes = sizing.size_chunk_cap(cfg, 1_000_000, cap, page_size=ps, dtype="bf16")
    assert sizes.swa_tokens == expected
    assert sizes.full_tokens % ps == 0
    assert sizing.bytes_used(cfg, sizes, "bf16") <= 1_000_000
    capped = sizing.size_chunk_cap_from_max_tokens(cfg, 50, cap, page_size=ps)
    assert capped.swa_tokens == min(expected, 50)


def test_min_ratio_estimate():
    cfg = load_preset("gpt-oss-120b")
    assert sizing.min_ratio_estimate(cfg, 16384, page_size=16) == (127 + 128 + 16) / 16384


@pytest.mark.parametrize("ratio", [0, -0.5, 1.5, float("nan")])
def test_bad_ratio_is_named(ratio):
    with pytest.raises(SizingError, match=re.escape(repr(ratio))):
        sizing.size_hybrid(HYBRID, B, ratio=ratio, page_size=1, dtype="bf16")


def test_swa_pool_below_window_floor():
    cfg = model(1, 1, window=100)
    with pytest.raises(SizingError, match=r"SWA pool of 64 tokens.*100 \+ 16 = 116"):
        sizing.solve_pool_sizes(cfg, 1280, ratio=0.05, page_size=16)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: sizing.solve_pool_sizes(HYBRID, 3, ratio=0.5, page_size=4), "3 tokens"),
        (lambda: sizing.solve_pool_sizes(HYBRID, 64, ratio=0.5, page_size=0), "page_size.*0"),
        (lambda: sizing.size_single_pool(HYBRID, 100, page_size=1, dtype="bf16"), "100 bytes"),
        (lambda: sizing.layer_bytes(HYBRID, "int3"), "int3"),
        (lambda: sizing.gib_to_bytes(-1.0), "-1.0"),
        (
            lambda: sizing.size_chunk_cap(
                model(1, 1), 1000, ChunkCap(64, 4096), page_size=1, dtype="bf16"
            ),
            "no room",
        ),
        (lambda: sizing.solve_pool_sizes(model(2, 0), 64, ratio=0.5, page_size=1), "single pool"),
    ],
)
def test_errors_name_values(call, message):
    with pytest.raises(SizingError, match=message):
        call()


def test_a_draft_models_layers_join_the_cell():
    """Speculative decoding keeps the draft's KV in the same two pools, token for token, so its
    layers join the cell (the term the seed's formula omits). gpt-oss-120b with gpt-oss-20b as
    draft, bf16, 40 GiB, ratio 0.5, by hand: per token and layer 8 KV heads x (64 + 64) x 2
    bytes = 2,048; full 18 + 12 layers = 61,440 bytes, SWA the same; cell 61,440 + 0.5 x 61,440
    = 92,160; N_full = floor(40 GiB / 92,160) = 466,033, N_swa = int(466,033 x 0.5) = 233,016."""
    target, draft = load_preset("gpt-oss-120b"), load_preset("gpt-oss-20b")
    assert sizing.token_bytes(target, "bf16", draft) == (61_440, 61_440)
    sizes = sizing.size_hybrid(
        target, 40 * 2**30, ratio=0.5, page_size=1, dtype="bf16", draft=draft
    )
    assert (sizes.full_tokens, sizes.swa_tokens) == (466_033, 233_016)
    alone = sizing.size_hybrid(target, 40 * 2**30, ratio=0.5, page_size=1, dtype="bf16")
    assert alone.full_tokens == 40 * 2**30 // (36_864 + 18_432)  # 776,722 without the draft
    single = sizing.size_single_pool(target, 40 * 2**30, page_size=1, dtype="bf16", draft=draft)
    assert single.full_tokens == 40 * 2**30 // 122_880
