"""The engine with params and both KV pools sharded over KV heads on 4 fake CPU devices
(tests/conftest.py requests them before jax starts) gives the same outputs as one device."""

import jax
import numpy as np
import pytest
from helpers import FIXTURES

from swajax import sizing
from swajax.api import engine_for
from swajax.models import HybridLM, load_decoder
from swajax.models.sharding import kv_mesh
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams


def run(path, mesh, attention="xla"):
    model = HybridLM(
        load_decoder(path, mesh=mesh),
        mesh=mesh,
        implementation=attention,
        interpret=attention == "pallas",
    )
    cfg = model.spec.hybrid
    sizes = sizing.solve_pool_sizes(cfg, 256, ratio=0.5, page_size=4)
    engine = engine_for(
        cfg,
        model,
        sizes,
        EngineOptions(max_running=4, max_context=64, chunk_size=8, eviction_interval=1),
    )
    prompt = [5, 17, 99, 3, 42, 64, 8, 120, 33, 71, 2, 90, 15, 56, 101, 27, 88, 11, 60, 45]
    rid = engine.add_request(
        prompt, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), keep_logits=True
    )
    engine.run()
    req = engine.requests[rid]
    return req.output, np.stack(req.logits), engine.runner.pools


@pytest.mark.parametrize(
    "family, attention",
    [
        ("gpt_oss", "pallas"),  # kernels inside shard_map, sinks split with their heads, MoE
        pytest.param("mimo_v2_flash", "xla", marks=pytest.mark.slow),  # two KV head counts
        pytest.param("gpt_oss", "xla", marks=pytest.mark.slow),
        pytest.param("llama4", "xla", marks=pytest.mark.slow),
    ],
)
def test_sharded_engine_matches_one_device(family, attention):
    """Params loaded straight into their shards; with Pallas the kernels run per device inside
    shard_map (interpret mode here), with sinks (gpt_oss)."""
    assert len(jax.devices()) >= 4
    heads = 2  # the fixtures have 2 (full) KV heads: split them over 2 of the 4 devices
    out_1, logits_1, _ = run(FIXTURES / family, None, attention)
    out_n, logits_n, pools = run(FIXTURES / family, kv_mesh(heads), attention)
    assert out_1 == out_n
    np.testing.assert_allclose(logits_n, logits_1, rtol=1e-5, atol=1e-5)
    shards = pools.full_k.addressable_shards
    assert len(shards) == heads and shards[0].data.shape[2] == pools.full_k.shape[2] // heads


def test_heads_must_divide_the_mesh():
    with pytest.raises(ValueError, match="not divisible by the 4 devices"):
        HybridLM(load_decoder(FIXTURES / "qwen3"), mesh=kv_mesh(4))


def test_parameters_load_straight_into_their_shards():
    decoder = load_decoder(FIXTURES / "llama4", mesh=kv_mesh(2))
    moe = decoder.layers[1].mlp  # experts: intermediate axis split, (gate, up) pairs together
    assert moe.gate_up[...].addressable_shards[0].data.shape == (4, 64, 32)
    assert moe.down[...].addressable_shards[0].data.shape == (4, 16, 64)
    q = decoder.layers[0].self_attn.q_proj.kernel[...]
    assert q.addressable_shards[0].data.shape == (64, 32)
    assert decoder.embed[...].addressable_shards[0].data.shape == decoder.embed[...].shape


def test_mlp_width_must_divide_the_mesh():
    with pytest.raises(ValueError, match="expert intermediate size 32 is not divisible by the 3"):
        load_decoder(FIXTURES / "gpt_oss", mesh=kv_mesh(3))


@pytest.mark.parametrize("family", ["gpt_oss_kv4", "qwen3_kv4"])
def test_four_way_split_matches_transformers(family):
    """Four KV heads over four devices (one per device): transformers' logits and greedy
    tokens, through the engine's one fused step program."""
    from test_models import rel_err, run_engine

    path = FIXTURES / family
    logits, output, greedy, engine = run_engine(path, mesh=kv_mesh(4))
    assert rel_err(logits, np.load(path / "logits.npy")) <= 1e-4
    assert output == greedy
    pools = engine.runner.pools  # one KV head a device: a quarter of each token's heads
    assert pools.full_k.addressable_shards[0].data.shape[2] * 4 == pools.full_k.shape[2]


def test_a_steady_sharded_decode_compiles_nothing_new():
    """Under a mesh the runner's state stays replicated step after step (no program for a
    new input sharding), like the single-device step."""
    mesh = kv_mesh(4)
    model = HybridLM(load_decoder(FIXTURES / "gpt_oss_kv4", mesh=mesh), mesh=mesh)
    cfg = model.spec.hybrid
    sizes = sizing.solve_pool_sizes(cfg, 512, ratio=0.5, page_size=4)
    options = EngineOptions(max_running=2, max_context=128, eviction_interval=1)
    engine = engine_for(cfg, model, sizes, options)
    engine.add_request(
        [5, 17, 99, 3, 42], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    )
    for _ in range(8):  # prefill, then the decode program and its eviction rounds
        engine.step()
    before = engine.runner.compilations()
    engine.run()
    assert engine.runner.compilations() == before


def test_multi_step_decode_runs_under_a_mesh():
    """With the runner's state replicated, a decode round (several steps in one program) runs
    split four ways too: one device's tokens, in fewer engine steps."""
    from swajax.api import LLM

    prompts = [[5, 17, 99, 3, 42, 64, 8, 120, 33, 71], [9, 4, 77, 31, 100, 6]]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    runs = {}
    for split, steps in ((1, 1), (4, 4)):
        llm = LLM(
            str(FIXTURES / "gpt_oss_kv4"),
            tensor_parallel_size=split,
            decode_steps=steps,
            max_running_requests=2,
            max_model_len=64,
        )
        runs[split] = (
            [o.outputs[0].token_ids for o in llm.generate(prompts, params)],
            llm.summary(),
        )
    assert runs[4][0] == runs[1][0]
    assert runs[4][1]["steps"] < runs[1][1]["steps"]


@pytest.mark.slow
def test_speculative_decoding_runs_under_a_mesh():
    """Target and draft on the same two-device mesh: the verify round is one program there too,
    with the unsplit run's tokens and acceptances."""
    from swajax.api import LLM

    prompts = [[100, 101, 32, 102], [40, 41, 42]]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    runs = []
    for split in (1, 2):
        llm = LLM(
            "tiny",
            draft_model="tiny",
            tensor_parallel_size=split,
            max_running_requests=2,
            max_model_len=128,
        )
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        runs.append((outs, llm.summary()["draft_tokens_accepted"]))
    assert runs[0] == runs[1] and runs[0][1] > 0


@pytest.mark.parametrize("scan_layers", [False, True])
def test_the_engines_model_keeps_the_parameters_split(scan_layers):
    """`HybridLM` places the loaded state again (`shard_state`); each split parameter must stay
    split there, scanned stacks included. (An `nnx.State` path ends at `.value`: the rules once
    matched none of them, so every device held every weight whole.)"""
    mesh = kv_mesh(2)
    model = HybridLM(
        load_decoder(FIXTURES / "llama4", mesh=mesh), mesh=mesh, scan_layers=scan_layers
    )
    split = [
        x
        for x in jax.tree.leaves(model.state)
        if len(x.sharding.device_set) == 2 and x.addressable_shards[0].data.shape != x.shape
    ]
    assert len(split) >= 4  # q / k / v / o projections and the experts, at least
    if not scan_layers:
        q = model.decoder.layers[0].self_attn.q_proj.kernel[...]
        assert q.addressable_shards[0].data.shape == (64, 32)
