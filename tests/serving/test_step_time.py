"""The step-time roofline (simulator/step_time.py) on a step computed by hand, the corrected
minimum ratio, and workload files."""

import json

import numpy as np
import pytest

from swajax import sizing
from swajax.config import AttentionShape, HybridConfig, LayerKind, LayerSpec
from swajax.presets import load_preset
from swajax.simulator.ratio_planner import corrected_min_ratio
from swajax.simulator.step_time import (
    ACCELERATORS,
    Accelerator,
    ModelCost,
    Span,
    StepTimeModel,
)
from swajax.simulator.workloads import from_file

SHAPE = AttentionShape(num_heads=2, num_kv_heads=1, head_dim=4, v_head_dim=4)
CFG = HybridConfig(
    "toy", (LayerSpec(LayerKind.SLIDING, 3), LayerSpec(LayerKind.FULL)), SHAPE, SHAPE
)


def test_one_step_by_hand():
    """Layers S (W = 3) and F, one KV head of 4 + 4 dims in bf16: 16 bytes per token-layer.
    A decodes at position 10; B prefills positions 0-3."""
    acc = Accelerator("toy", hbm_bytes_per_s=1000, bf16_flops=1e4, memory_bytes=1e9, overhead_s=0.5)
    model = StepTimeModel(CFG, ModelCost(1000, 1000, 2000), acc)
    # KV read: A full 11 keys, A sliding keys 7-10 (4); B full 4, B sliding 4 -> 23 x 16 bytes
    # weights 2000 -> 2368 bytes, 2.368 s.
    # FLOPs: 2 x 1000 x 5 new tokens; attention 2 x 2 heads x (4 + 4) = 32 per (query, key):
    # A: 11 (full) + 4 (sliding); B: 1 + 2 + 3 + 4 = 10 on each layer -> 35 x 32 = 1120.
    # max(2.368, 1.112) + 0.5
    assert model.step_seconds([Span(10, 11), Span(0, 4)]) == pytest.approx(2.868)
    assert model.step_seconds([]) == 0.0


def _per_layer(model: StepTimeModel, spans) -> float:
    """The roofline written plainly, request by request and layer by layer: what the grouped
    arrays must add up to."""
    f_bytes, s_bytes = sizing.layer_bytes(model.cfg, model.kv_dtype)

    def visible(layer, q):
        if layer.kind is LayerKind.FULL:
            return q + 1
        if layer.kind is LayerKind.CHUNKED:
            return q % layer.window + 1
        return min(q, layer.window) + 1

    kv = flops = tokens = 0
    for span in spans:
        new = span.seq_len - span.prefix_len
        tokens += new
        for layer in model.cfg.layers:
            shape = model.cfg.swa_attention if layer.kind.is_local else model.cfg.full_attention
            seen = visible(layer, span.prefix_len)
            pairs = new * (seen + visible(layer, span.seq_len - 1)) / 2
            flops += 2 * shape.num_heads * (shape.head_dim + shape.v_head_dim) * pairs
            if layer.kv_source is None:
                local = layer.kind.is_local
                keys = min(span.seq_len, seen + new - 1) if local else span.seq_len
                kv += keys * (s_bytes if local else f_bytes)
            if layer.compress_rate:  # DeepSeek-V4: entries of the windows ended so far
                r, k, d = layer.compress_rate, layer.compress_topk, shape.head_dim
                ended = span.seq_len // r
                first, last = (span.prefix_len + 1) // r, span.seq_len // r
                if k:  # CSA: every indexer key, the top-k entries of each query
                    kv += ended * (layer.compress_dims - d) * 2 + min(ended, new * k) * d * 2
                    first, last = min(first, k), min(last, k)
                else:
                    kv += ended * d * 2
                flops += 2 * shape.num_heads * 2 * d * new * (first + last) / 2
    acc = model.accelerator
    read = model.cost.weights_read(tokens) + kv
    flops += 2 * model.cost.active_params * tokens
    return max(read / acc.hbm_bytes_per_s, flops / acc.bf16_flops) + acc.overhead_s


@pytest.mark.parametrize(
    "preset", ["gpt-oss-120b", "llama-4-scout", "gemma-4-e4b", "mimo-v2-flash", "deepseek-v4-flash"]
)
def test_grouped_layers_cost_what_each_layer_costs(preset):
    """Sliding, chunked, full and KV-sharing layers, decode and prefill spans of every length."""
    rng = np.random.default_rng(0)
    model = StepTimeModel(
        load_preset(preset), ModelCost(1e9, 2e8, 2e9, 32, 4), ACCELERATORS["h200"]
    )
    for _ in range(20):
        prefix = rng.integers(0, 40_000, rng.integers(1, 40))
        new = np.where(rng.random(len(prefix)) < 0.7, 1, rng.integers(1, 9000, len(prefix)))
        spans = [Span(int(p), int(p + n)) for p, n in zip(prefix, new)]
        assert model.step_seconds(spans) == pytest.approx(_per_layer(model, spans), rel=1e-12)


def test_moe_weights_read_as_expected_touched():
    cost = ModelCost(total_params=100, active_params=28, weight_bytes=100, experts=10, top_k=2)
    assert cost.expert_bytes == pytest.approx(90)  # dense 10 + 90 x 2/10 = 28 active
    assert cost.weights_read(1) == pytest.approx(28)  # one token touches its 2 experts
    assert cost.weights_read(2) == pytest.approx(100 - 90 * 0.8**2)
    assert cost.weights_read(10_000) == pytest.approx(100)


def test_hybrid_reads_less_kv_than_one_pool_per_decode_token():
    from swajax.cli.args import model_cost
    from swajax.presets import hf_preset
    from swajax.simulator.step_time import ACCELERATORS

    cfg = load_preset("gpt-oss-120b")
    model = StepTimeModel(cfg, model_cost(hf_preset("gpt-oss-120b")), ACCELERATORS["h200"])
    short, long = model.step_seconds([Span(1000, 1001)]), model.step_seconds([Span(30000, 30001)])
    # only the 18 full layers' reads grow with the context
    f, _ = sizing.token_bytes(cfg, "bf16")
    assert long - short == pytest.approx(29_000 * f / ACCELERATORS["h200"].hbm_bytes_per_s)


@pytest.mark.parametrize("chunk", [2048, 8192])
def test_corrected_min_ratio_holds_the_chunk_and_the_windows(chunk):
    cfg, budget, mean_len, ps = load_preset("gpt-oss-120b"), sizing.gib_to_bytes(16), 24_000, 16
    r = corrected_min_ratio(cfg, budget, mean_len=mean_len, chunk=chunk, page_size=ps)
    f, s = sizing.token_bytes(cfg, "bf16")
    w = cfg.sliding_window + sizing.DEFAULT_EVICTION_INTERVAL + ps

    def demand_met(ratio):
        n_full = budget / (f + ratio * s)
        return ratio * n_full >= chunk + min(256, n_full / mean_len) * w - 1e-6

    assert demand_met(r) and not demand_met(r * 0.99)
    assert r > w / mean_len  # the old estimate leaves the chunk out
    assert r < 1


def test_workload_file(tmp_path):
    path = tmp_path / "w.jsonl"
    rows = [
        {"prompt_len": 8, "output_len": 4, "prefix_id": "chat", "arrival": 1.5},
        {"prompt_len": 12, "output_len": 2, "prefix_id": "chat"},
        {"prompt_len": 5, "output_len": 3},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    w = from_file(path)
    assert [a.at for a in w.initial] == [0.0, 0.0, 1.5]  # sorted by arrival
    second, third, first = w.initial
    assert second.prompt[:8] == first.prompt and len(second.prompt) == 12  # one stream
    assert len(third.prompt) == 5 and third.params.max_tokens == 3 and w.total == 3
    path.write_text('{"prompt_len": 0, "output_len": 4}\n')
    with pytest.raises(ValueError, match=r"w.jsonl:1: 'prompt_len' must be an integer"):
        from_file(path)
    path.write_text('{"prompt_len": 3, "output_len": 4, "colour": 1}\n')
    with pytest.raises(ValueError, match="w.jsonl:1: expected an object with keys"):
        from_file(path)


def test_simulated_clock_submits_arrivals_on_time(tmp_path):
    """A request arriving at 100 s waits for the clock (the engine idles until then); its
    time to first token counts from its arrival."""
    from swajax.serving.options import EngineOptions
    from swajax.simulator.run import run_workload

    cfg = load_preset("tiny-hybrid")
    path = tmp_path / "w.jsonl"
    path.write_text(
        '{"prompt_len": 40, "output_len": 5}\n{"prompt_len": 40, "output_len": 5, "arrival": 100}\n'
    )
    acc = Accelerator("toy", hbm_bytes_per_s=1e6, bf16_flops=1e9, memory_bytes=1e9, overhead_s=0.1)
    timer = StepTimeModel(cfg, ModelCost(1e5, 1e5, 1e5), acc)
    sizes = sizing.solve_pool_sizes(cfg, 512, ratio=0.5, page_size=4)
    run = run_workload(
        cfg,
        sizes,
        from_file(path),
        options=EngineOptions(chunk_size=16),
        progress=False,
        timer=timer,
    )
    assert run.finished == 2 and run.lost == 0
    # each request: 3 prefill chunks then 4 decode steps, ~0.2 s each; the second starts at 100
    assert 100 < run.modeled_seconds < 103
    assert 0.3 < run.ttft_s < 1.0 and 0.1 < run.itl_s < 0.3
    assert run.tokens_per_s == pytest.approx(10 / run.modeled_seconds)
