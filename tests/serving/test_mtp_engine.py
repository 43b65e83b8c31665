"""MTP drafting in the engine: greedy output is exactly plain decoding's (the speculative
exactness property) with the checkpoint's own draft layer, for k = 1, 2, 4, with eviction every
step, a prefix hit, retraction and overlap; the draft's KV (in the SWA pool: the layer slides)
comes back with the target's, as the recorded trace replays; and a round is reproducible when
it samples."""

import numpy as np
import pytest
from helpers import FIXTURES
from helpers.engine_checks import check_clean, check_replays

from swajax import sizing
from swajax.api import engine_for
from swajax.models import load_decoder
from swajax.models.decoder import HybridLM
from swajax.models.mtp import MtpLM, load_mtp
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams
from swajax.trace.recorder import Tracer

PROMPTS = [[(7 * i + 5 * j) % 120 + 1 for i in range(15 + 8 * j)] for j in range(3)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def run(
    family,
    k=0,
    *,
    gib=0.002,
    overlap=True,
    trace=None,
    params=GREEDY,
    prompts=PROMPTS,
    steps=None,
    requests=True,
):
    """`steps`: stop after that many steps (None: run to the end); `requests=False`: add none."""
    path = FIXTURES / family
    decoder = load_decoder(path)
    model = HybridLM(decoder, dtype="fp32")
    draft = MtpLM(load_mtp(path, decoder.spec), model) if k else None
    cfg = decoder.spec.hybrid
    sizes = sizing.size_hybrid(
        cfg,
        sizing.gib_to_bytes(gib),
        ratio=0.5,
        page_size=4,
        dtype="fp32",
        draft=draft.spec.hybrid if draft is not None else None,
    )
    options = EngineOptions(
        chunk_size=8,
        eviction_interval=1,
        max_context=128,
        num_speculative_tokens=k,
        overlap=overlap,
    )
    engine = engine_for(cfg, model, sizes, options, draft=draft)
    tracer = Tracer(engine) if trace is not None else None
    if not requests:
        return [], engine
    rids = [engine.add_request(p, params) for p in prompts]
    rids.append(engine.add_request(prompts[-1][:20] + [9, 9], params))  # a prefix hit
    if steps is not None:
        for _ in range(steps):
            engine.step()
        return [], engine
    engine.run()
    if tracer is not None:
        check_replays(tracer, trace)
    check_clean(engine)
    return [engine.requests[r].output for r in rids], engine


# One worker runs this module, so each family's plain run is made once, when first asked for.
pytestmark = pytest.mark.xdist_group("mtp-engine")


class _Plain(dict):
    def __missing__(self, family):
        self[family] = run(family)[0]
        return self[family]


@pytest.fixture(scope="module")
def plain():
    """Plain decoding's outputs per family (made on first use)."""
    return _Plain()


@pytest.mark.parametrize(
    "family, k",
    [
        # k = 1, 2, 4 each in the default run, by one family; every pair in `-m slow`
        ("mimo_v2_flash_mtp", 2),
        ("step3p7_mtp", 4),
        ("deepseek_v4_mtp", 1),
        pytest.param("step3p7_mtp", 1, marks=pytest.mark.slow),
        pytest.param("deepseek_v4_mtp", 2, marks=pytest.mark.slow),
        pytest.param("deepseek_v4_mtp", 4, marks=pytest.mark.slow),
        pytest.param("mimo_v2_flash_mtp", 1, marks=pytest.mark.slow),
        pytest.param("mimo_v2_flash_mtp", 4, marks=pytest.mark.slow),
        pytest.param("step3p7_mtp", 2, marks=pytest.mark.slow),
    ],
)
def test_mtp_drafting_gives_plain_greedy_output(plain, family, k, tmp_path):
    outputs, engine = run(family, k, trace=tmp_path / "t.jsonl")
    assert outputs == plain[family]
    assert engine.metrics and any(m.kind == "decode" for m in engine.metrics)


@pytest.mark.slow  # two engines of their own pool sizes (25 s); the default run's prefix hit
# skips a buffered entry as a resumed request does
def test_mtp_through_retraction_and_without_overlap():
    """Pools too small for every request's generation: requests are retracted and come back
    (their draft entries rewritten from a fresh prefill)."""
    params = SamplingParams(temperature=0.0, max_tokens=40)
    prompts = [[(3 * i + j) % 100 + 1 for i in range(8 + 4 * j)] for j in range(6)]
    kw = dict(gib=0.00012, overlap=False, params=params, prompts=prompts)
    expected, _ = run("mimo_v2_flash_mtp", **kw)
    outputs, engine = run("mimo_v2_flash_mtp", 2, **kw)
    assert engine.scheduler.retractions > 0
    assert outputs == expected


@pytest.mark.slow  # the draft-model rounds' reproducibility is tested by default
def test_a_sampled_mtp_round_is_reproducible():
    params = SamplingParams(temperature=0.8, max_tokens=10, seed=3)
    a, _ = run("step3p7_mtp", 2, params=params)
    b, _ = run("step3p7_mtp", 2, params=params)
    assert a == b and all(len(o) == 10 for o in a)
    assert not np.array_equal(a[0], a[1])


def test_an_mtp_engine_resumes_from_a_snapshot(plain, tmp_path):
    """Saved mid-run (the draft's pools and its hidden-state buffer beside the target's) and
    restored into a fresh engine, the run ends with plain decoding's tokens."""
    family = "mimo_v2_flash_mtp"
    _, engine = run(family, 2, steps=6)
    engine.snapshot(tmp_path / "snap")
    _, fresh = run(family, 2, steps=0, requests=False)
    fresh.restore(tmp_path / "snap")
    fresh.run()
    assert [fresh.requests[r].output for r in sorted(fresh.requests)] == plain[family]
    check_clean(fresh)


@pytest.mark.slow  # the draft is placed by the target's sharding rules, tested by default
def test_mtp_over_two_tensor_parallel_devices(plain):
    """The draft layer split by heads like the target (its pools too): the same tokens."""
    from swajax.api.engine_spec import EngineSpec, make_engine, tensor_mesh

    family = "step3p7_mtp"
    mesh = tensor_mesh(2)
    decoder = load_decoder(FIXTURES / family, mesh=mesh)
    spec = EngineSpec.of(
        dtype="float32",
        kv_dtype="fp32",
        tensor_parallel=2,
        num_speculative_tokens=2,
        page_size=4,
        chunk_size=8,
        eviction_interval=1,
        max_context=128,
        kv_budget_gib=0.002,
        ratio=0.5,
    )
    engine = make_engine(decoder, spec, load_mtp(FIXTURES / family, decoder.spec, mesh=mesh))
    rids = [engine.add_request(p, GREEDY) for p in PROMPTS]
    rids.append(engine.add_request(PROMPTS[-1][:20] + [9, 9], GREEDY))
    engine.run()
    assert [engine.requests[r].output for r in rids] == plain[family]
    check_clean(engine)


def test_the_llm_drafts_with_the_checkpoints_own_layer_by_name(plain):
    """`LLM(model, draft_model="mtp")`, vLLM's name for the method: plain decoding's tokens; a
    checkpoint without MTP layers, or a family without them here, is refused by name."""
    from swajax import LLM
    from swajax.errors import InputError

    path = str(FIXTURES / "step3p7_mtp")
    prompt = {"prompt_token_ids": PROMPTS[0]}
    kw = dict(dtype="float32", kv_budget_gib=0.002, page_size=4)
    drafted = LLM(path, draft_model="mtp", num_speculative_tokens=2, **kw)
    got = drafted.generate(prompt, GREEDY)[0].outputs[0].token_ids
    assert list(got) == list(plain["step3p7_mtp"][0])
    assert any(m.new_tokens for m in drafted.engine.metrics if m.kind == "decode")
    assert drafted.engine.draft is not None
    with pytest.raises(InputError, match="declares no MTP layers"):
        LLM(str(FIXTURES / "mimo_v2_flash"), draft_model="mtp", **kw)
    with pytest.raises(InputError, match="MTP drafts are built for"):
        LLM(str(FIXTURES / "qwen3"), draft_model="mtp", **kw)
