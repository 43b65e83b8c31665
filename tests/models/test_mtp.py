"""The checkpoints' own draft layers (MTP): read as the hub lays them out, their forward matches
transformers' (`MtpModel` over the family's decoder layer, tools/make_mtp_fixtures.py), and the
engine writes their KV at the positions the reference forward does, chunk after chunk."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FIXTURES, rel_err

from swajax import sizing
from swajax.api import engine_for
from swajax.attention.metadata import build_metadata
from swajax.errors import InputError
from swajax.memory import allocator as A, req_to_token as R
from swajax.models import load_decoder
from swajax.models.checkpoint import LoadError
from swajax.models.decoder import HybridLM
from swajax.models.mtp import MtpLM, load_mtp, mtp_config
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams
from swajax.sizing import PoolMode, PoolSizes

FAMILIES = ["mimo_v2_flash_mtp", "step3p7_mtp", "deepseek_v4_mtp"]
PROMPT = json.loads((FIXTURES / "step3p7" / "greedy.json").read_text())["prompt"]


def _prompt(path):
    """The prompt the fixture's reference logits were made over (DeepSeek-V4's is longer)."""
    own = path / "prompt.json"
    return json.loads(own.read_text()) if own.exists() else PROMPT


def _reference_forward(path):
    """The target over the prompt, then the MTP layer over (hidden_i, token_i+1), i < n - 1, in
    one batch each: (MTP logits [n - 1, V], its K and V of those positions [n - 1, heads, dim];
    DeepSeek-V4's V is its K)."""
    prompt = _prompt(path)
    decoder = load_decoder(path)
    model = HybridLM(decoder, dtype="fp32", scan_layers=False)
    mtp = MtpLM(load_mtp(path, decoder.spec), model)
    n, ps, cap = len(prompt), 4, 128
    sizes = PoolSizes(PoolMode.SINGLE, cap, cap, ps)
    alloc = A.init_allocator(cap, cap, ps, PoolMode.SINGLE)
    r2t = R.ReqToToken.init(1, cap)
    alloc, res = A.alloc_extend(alloc, [0], [n], [-1])
    r2t = R.write(r2t, [0], [0], [n], res.full_slots)
    meta = build_metadata(r2t, alloc, [0], [0], [n], window=0)
    tokens = jnp.zeros(meta.num_tokens, jnp.int32).at[:n].set(jnp.asarray(prompt))
    rows = jnp.arange(meta.num_tokens, dtype=jnp.int32)
    hidden, _, _ = model.forward.hidden_logits(
        model.params, model.init_pools(sizes), tokens, meta, rows
    )
    m = build_metadata(r2t, alloc, [0], [0], [n - 1], window=0)
    state = mtp.draft_state(sizes, 1)
    t = m.num_tokens
    following = jnp.zeros(t, jnp.int32).at[: n - 1].set(jnp.asarray(prompt[1:]))
    logits, _, pools = mtp.fused_forward.logits(
        mtp.params, model.params, state.pools, following, hidden[:t], m
    )
    slots = np.asarray(r2t.table[0, : n - 1])
    k, v = pools.layer(0)
    return np.asarray(logits[: n - 1]), np.asarray(k)[slots], np.asarray(v)[slots]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_draft_layer_matches_transformers(family):
    logits, _, _ = _reference_forward(FIXTURES / family)
    expected = np.load(FIXTURES / family / "mtp_logits.npy")
    assert rel_err(logits, expected) < 1e-4


@pytest.mark.parametrize(
    "family, mode",
    [("mimo_v2_flash_mtp", PoolMode.SINGLE), ("step3p7_mtp", PoolMode.SINGLE)]
    + [("mimo_v2_flash_mtp", PoolMode.HYBRID)]
    # the same path with V4's layer (its streams in the buffer); its engine runs by default
    + [pytest.param("deepseek_v4_mtp", PoolMode.HYBRID, marks=pytest.mark.slow)],
)
def test_chunked_prefill_writes_the_reference_entries(family, mode):
    """The engine's prefill in chunks of 8 (every chunk pairs its first position's hidden state
    from the buffer with its first token) leaves the very entries the one-batch forward makes.
    In hybrid pools, with pages of one token and eviction before every chunk, the entries the
    window keeps sit in the SWA pool at the SWA slots of their positions. (A longer reference
    prompt's first entries are this one's: they read nothing after their position.)"""
    path = FIXTURES / family
    _, k_ref, v_ref = _reference_forward(path)
    prompt = _prompt(path)[: len(PROMPT)]
    k_ref, v_ref = k_ref[: len(prompt) - 1], v_ref[: len(prompt) - 1]
    decoder = load_decoder(path)
    model = HybridLM(decoder, dtype="fp32")
    mtp = MtpLM(load_mtp(path, decoder.spec), model)
    hybrid = mode is PoolMode.HYBRID
    sizes = PoolSizes(mode, 256, 256, 1 if hybrid else 4)
    options = EngineOptions(
        max_running=2,
        max_context=64,
        chunk_size=8,
        num_speculative_tokens=2,
        prefix_cache=False,
        eviction_interval=1,
        overlap=False,
    )
    engine = engine_for(decoder.spec.hybrid, model, sizes, options, draft=mtp)
    rid = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=16))
    for _ in range(3):  # the three chunks
        engine.step()
    req = engine.requests[rid]
    slots = np.asarray(engine.runner.r2t.table[req.row, : len(prompt) - 1])
    if hybrid:  # the SWA slots of the entries the window keeps (freed ones translate to 0)
        slots = np.asarray(A.translate(engine.runner.alloc, jnp.asarray(slots)))
    live = slots > 0
    if hybrid:
        assert 0 < live.sum() < len(slots) and live[16 - 1]  # the last chunk's first entry
    k, v = engine.runner.draft_pools.pools.layer(0)
    np.testing.assert_allclose(np.asarray(k)[slots[live]], k_ref[live], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(v)[slots[live]], v_ref[live], rtol=1e-4, atol=1e-5)


def test_the_draft_layers_kind_window_and_sizing():
    cfg = json.loads((FIXTURES / "mimo_v2_flash_mtp" / "config.json").read_text())
    draft = load_mtp(FIXTURES / "mimo_v2_flash_mtp", load_decoder(FIXTURES / "mimo_v2_flash").spec)
    hybrid = draft.spec.hybrid
    assert [la.kind.is_local for la in hybrid.layers] == [True]
    assert (
        hybrid.sliding_window == load_decoder(FIXTURES / "mimo_v2_flash").spec.hybrid.sliding_window
    )
    target = load_decoder(FIXTURES / "mimo_v2_flash").spec.hybrid
    full, swa = sizing.token_bytes(target, "fp32")
    full_d, swa_d = sizing.token_bytes(target, "fp32", hybrid)
    # One more SWA layer of the SWA shape: its K and V per token, and nothing on the full side.
    shape = target.swa_attention
    assert full_d == full
    assert swa_d - swa == 4 * shape.num_kv_heads * (shape.head_dim + shape.v_head_dim)
    assert mtp_config(cfg)["num_hidden_layers"] == 1


def test_checkpoints_without_draft_layers_say_so(tmp_path):
    with pytest.raises(InputError, match="declares no MTP layers"):
        load_mtp(FIXTURES / "mimo_v2_flash", load_decoder(FIXTURES / "mimo_v2_flash").spec)
    with pytest.raises(InputError, match="MTP drafts are built for"):
        load_mtp(FIXTURES / "gpt_oss", load_decoder(FIXTURES / "gpt_oss").spec)
    # A declared layer whose tensors are missing is named.
    dst = tmp_path / "m"
    dst.mkdir()
    for f in (FIXTURES / "mimo_v2_flash_mtp").iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(dst / "model.safetensors"))
    del weights["model.mtp.layers.0.eh_proj.weight"]
    save_file(weights, str(dst / "model.safetensors"))
    with pytest.raises(LoadError, match="model.mtp.layers.0.eh_proj.weight"):
        load_mtp(dst, load_decoder(dst).spec)


def test_the_hubs_padded_per_layer_lists_name_the_draft_layer():
    """Step 3.x hub configs pad their per-layer lists with the MTP layers' entries (45 decoder
    layers + 3): the draft layer takes entry 45 of each, and base head counts (transformers'
    rule without `mtp_per_layer_config`); the decoder keeps its 45."""
    from swajax.models.family_specs import model_spec
    from swajax.presets import STEP_3_5_FLASH

    n, m = 45, 3
    cfg = dict(STEP_3_5_FLASH, num_nextn_predict_layers=m)
    cfg["layer_types"] = STEP_3_5_FLASH["layer_types"] + ["sliding_attention"] * m
    cfg["swiglu_limits"] = [None] * n + [7.0] * m
    cfg["swiglu_limits_shared"] = [None] * (n + m)
    draft = model_spec(mtp_config(cfg))
    assert draft.num_layers == 1 and draft.hybrid.layers[0].kind.is_local
    assert draft.hybrid.sliding_window == model_spec(cfg).hybrid.sliding_window
    assert draft.hybrid.swa_attention.num_heads == cfg["num_attention_heads"]
    assert draft.mlps == ("dense",) and draft.intermediate == (cfg["intermediate_size"],)
    assert draft.expert_limits == (7.0,)
    assert model_spec(cfg).num_layers == n


def test_deepseek_v4s_hub_config_gives_a_window_only_routed_draft_layer():
    """DeepSeek-V4-Flash's hub config lists `compress_ratios` for its 43 layers and the MTP
    layer (a trailing 0: window only); the draft layer is top-k routed (its number is past the
    three hash-routed layers), with the target's window; a compressed MTP layer is refused (the
    hub's has no compressor tensors)."""
    from swajax.config import ConfigError
    from swajax.models.family_specs import model_spec
    from swajax.presets import DEEPSEEK_V4_FLASH

    cfg = dict(DEEPSEEK_V4_FLASH, num_nextn_predict_layers=1)
    draft = model_spec(mtp_config(cfg))
    target = model_spec(cfg)
    assert target.num_layers == 43 and draft.num_layers == 1
    assert draft.hybrid.layers[0].kind.is_local and not draft.hybrid.layers[0].compress_rate
    assert draft.hybrid.sliding_window == target.hybrid.sliding_window
    assert draft.v4.hash_layers == (False,) and target.v4.hash_layers[:4] == (True,) * 3 + (False,)
    assert draft.hidden == target.hidden and draft.v4.hc_mult == target.v4.hc_mult
    cfg["compress_ratios"] = cfg["compress_ratios"][:-1] + [4]
    with pytest.raises(ConfigError, match="compress ratio 4"):
        mtp_config(cfg)

    # The fixture's layer in the sizing: one more window-only layer, its one shared-KV head
    # (K is V), nothing on the full side.
    target = load_decoder(FIXTURES / "deepseek_v4_mtp").spec
    layer = load_mtp(FIXTURES / "deepseek_v4_mtp", target)
    full, swa = sizing.token_bytes(target.hybrid, "fp32")
    full_d, swa_d = sizing.token_bytes(target.hybrid, "fp32", layer.spec.hybrid)
    assert (full_d, swa_d - swa) == (full, 4 * target.hybrid.swa_attention.head_dim)
