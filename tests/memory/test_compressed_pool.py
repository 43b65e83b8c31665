"""DeepSeek-V4's third lifetime: compressed entries addressed from the full index, pending
compressor projections in the SWA slots (swajax/memory/compressed_pool.py)."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from swajax import sizing
from swajax.config import ConfigError, parse_hf_config
from swajax.memory.compressed_pool import CompressedPools
from swajax.memory.pool import bytes_allocated, init_pools

CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"
BASE = {
    "model_type": "deepseek_v4",
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "sliding_window": 10,
    "index_head_dim": 8,
    "vocab_size": 128,
    "layer_types": ["sliding_attention", CSA, HCA, CSA],
    "compress_rates": {CSA: 3, HCA: 6},
}


def store(rate: int, page_size: int) -> CompressedPools:
    return CompressedPools((), (), (0,), (rate,), page_size)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.integers(1, 160),
    page_size=st.sampled_from([1, 2, 3, 4, 8, 16, 64, 128]),
    pages=st.lists(st.integers(1, 50), min_size=1, max_size=8, unique=True),
)
def test_window_ends_get_distinct_slots_inside_their_page(rate, page_size, pages):
    """A request's positions fill its pages in order (page j of the request holds positions
    [j * ps, (j + 1) * ps)); the windows ending on its pages get pairwise distinct entry slots,
    each among its own page's E = ceil(ps / rate)."""
    pool = store(rate, page_size)
    e = -(-page_size // rate)
    ends = [p for p in range(len(pages) * page_size) if (p + 1) % rate == 0]
    full = np.array([pages[p // page_size] * page_size + p % page_size for p in ends], np.int32)
    slots = np.asarray(pool.entry_slot(0, jax.numpy.asarray(full)))
    assert len(set(slots.tolist())) == len(ends)
    page_of = full // page_size
    assert np.all((slots >= page_of * e) & (slots < (page_of + 1) * e))


def test_a_window_shorter_than_the_compressor_span_is_refused():
    with pytest.raises(ConfigError, match="compress rate of 6 reads 5 tokens back.*W = 4"):
        parse_hf_config(BASE | {"sliding_window": 5, "compress_rates": {CSA: 2, HCA: 6}})
    with pytest.raises(ConfigError, match="compress rate of 3 reads 5 tokens back.*W = 4"):
        parse_hf_config(BASE | {"sliding_window": 5, "compress_rates": {CSA: 3, HCA: 4}})
    assert parse_hf_config(BASE | {"sliding_window": 6}).layer_mix == "hybrid"


@pytest.mark.parametrize("page_size", [1, 3, 4, 6, 8, 16])
def test_sizing_counts_every_byte_the_pools_hold(page_size):
    """Entries: ceil(ps / rate) per full page (rates 3 and 6 divide some page sizes, not
    others); pending rows: one per SWA slot. What `sizing` says equals what is allocated."""
    cfg = parse_hf_config(BASE)
    sizes = sizing.size_hybrid(cfg, 1 << 20, ratio=0.5, page_size=page_size, dtype="bf16")
    pools = init_pools(cfg, sizes, "bf16")
    dummy = sizing.PoolSizes("hybrid", page_size, page_size, page_size)  # each pool's page 0
    expected = sizing.bytes_used(cfg, sizes, "bf16") + sizing.bytes_used(cfg, dummy, "bf16")
    assert bytes_allocated(pools) == pytest.approx(expected, abs=1)
    assert bytes_allocated(pools) <= (1 << 20) + sizing.bytes_used(cfg, dummy, "bf16")
    per_page = {3: -(-page_size // 3), 6: -(-page_size // 6)}
    rows = (sizes.full_tokens + page_size) // page_size
    shapes = [a.shape for a in pools.compressed.entries]
    assert shapes == [(rows * per_page[3], 40), (rows * per_page[6], 32), (rows * per_page[3], 40)]
    assert [a.shape[1] for a in pools.compressed.pending] == [160, 64, 160]


def test_deepseek_v4_defaults_to_its_own_ratio_and_page_size():
    cfg = parse_hf_config(BASE)
    assert sizing.resolve_ratio(cfg, None, 0.8) == 0.1
    assert sizing.resolve_ratio(cfg, 0.3, 0.8) == 0.3
    assert sizing.resolve_page_size(cfg, None, 1) == 64
    qwen = parse_hf_config(
        {
            "model_type": "qwen3",
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        }
    )
    assert sizing.resolve_ratio(qwen, None, 0.8) == 0.8
