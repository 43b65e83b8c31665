"""Speculative rounds honour every sampling field exactly as plain decoding does.

The oracle is the same engine without a draft. Greedy requests, each with other fields, share a
batch: penalties (the counts a row sees include the proposals accepted before it), logit bias,
allowed tokens, bad words of one and two tokens, min_tokens over a stop token, top-N logprobs,
kept logits, a length limit ending mid-round. Drafts: the target itself (every proposal kept:
row j must count d1 .. dj), the target with its head rotated (none kept), another family's
model (some kept), and the checkpoint's own MTP layer; k = 1, 2, 4. Tokens are identical,
logprobs and logits equal to float tolerance, and both pools come back whole (the trace
replays). Sampled requests with penalties and top-p follow plain decoding's distribution
(chi-square on the first and a later token).
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FIXTURES
from helpers.engine_checks import check_clean, check_replays
from scipy import stats

from swajax import sizing
from swajax.api import engine_for
from swajax.models import load_decoder
from swajax.models.decoder import HybridLM
from swajax.models.mtp import MtpLM, load_mtp
from swajax.serving.options import EngineOptions
from swajax.serving.sampling_params import SamplingParams
from swajax.trace.recorder import Tracer

PROMPTS = [[(5 * i + 3 * j) % 120 + 1 for i in range(14 + 7 * j)] for j in range(4)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=13)

pytestmark = pytest.mark.xdist_group("speculative-fields")


def engine(family, k=0, draft=None, *, gib=0.002, trace=None, mtp=False, max_running=None):
    path = FIXTURES / family
    decoder = load_decoder(path)
    model = HybridLM(decoder, dtype="fp32")
    if mtp and k:
        draft_lm = MtpLM(load_mtp(path, decoder.spec), model)
    else:
        draft_lm = HybridLM(draft, dtype="fp32") if draft is not None else None
    cfg = decoder.spec.hybrid
    sizes = sizing.size_hybrid(
        cfg,
        sizing.gib_to_bytes(gib),
        ratio=0.5,
        page_size=4,
        dtype="fp32",
        draft=draft_lm.spec.hybrid if draft_lm is not None else None,
    )
    fields = dict(chunk_size=16, eviction_interval=1, max_context=256, num_speculative_tokens=k)
    if max_running is not None:
        fields["max_running"] = max_running
    e = engine_for(cfg, model, sizes, EngineOptions(**fields), draft=draft_lm)
    return e, (Tracer(e) if trace is not None else None)


def cases(plain_outputs):
    """Each prompt's fields, chosen from what plain greedy decoding emits without them so that
    every rule bites: the stop token min_tokens holds back and the bigram a bad word bans."""
    a, b, c, _ = plain_outputs
    return [
        dict(repetition_penalty=1.6, presence_penalty=0.4, frequency_penalty=0.3, logprobs=3),
        dict(logit_bias={7: 2.5, a[3]: -1.5}, min_tokens=6, stop_token_ids=(b[1],)),
        dict(
            allowed_token_ids=tuple(sorted({*c, *range(30, 90)})),
            bad_words_token_ids=((c[2], c[3]), (c[5],)),
            frequency_penalty=0.2,
        ),
        dict(max_tokens=7, logprobs=2),
    ]


def run(family, k=0, draft=None, *, fields, trace=None, mtp=False, retract_after=None):
    """Outputs, logprobs, top-N and kept logits of each prompt with its fields (the first keeps
    its logits), in one batch; `retract_after` n tokens, the first two requests are retracted
    (and re-admitted with their counts, rules and kept logits so far)."""
    e, tracer = engine(family, k, draft, trace=trace, mtp=mtp)
    rids = [
        e.add_request(p, dataclasses.replace(GREEDY, **f), keep_logits=i == 0)
        for i, (p, f) in enumerate(zip(PROMPTS, fields))
    ]
    if retract_after is not None:
        first = [e.requests[r] for r in rids[:2]]
        while min(len(r.output) for r in first) < retract_after:
            e.step()
        for r in first:
            e.scheduler.retract(r)
    e.run()
    if tracer is not None:
        check_replays(tracer, trace)
    check_clean(e)
    reqs = [e.requests[r] for r in rids]
    return [(r.output, r.logprobs, r.top_logprobs, r.logits, r.finish_reason) for r in reqs], e


def bare(family):
    e, _ = engine(family)
    rids = [e.add_request(p, GREEDY) for p in PROMPTS]
    e.run()
    return [e.requests[r].output for r in rids]


def assert_same(got, want):
    for (out, lp, top, logits, why), (out0, lp0, top0, logits0, why0) in zip(got, want):
        assert out == out0 and why == why0
        np.testing.assert_allclose(lp, lp0, rtol=1e-4, atol=1e-4)
        assert [sorted(t) for t in top] == [sorted(t) for t in top0]
        for t, t0 in zip(top, top0):
            np.testing.assert_allclose(
                [t[i] for i in sorted(t)], [t0[i] for i in sorted(t0)], 1e-4, 1e-4
            )
        assert len(logits) == len(logits0)
        if logits:
            np.testing.assert_allclose(np.stack(logits), np.stack(logits0), rtol=1e-4, atol=1e-4)


def oracle(family):
    """The fields and plain decoding's results with them; each field changes the output, and
    plain decoding keeps each rule as its definition says."""
    without = bare(family)
    fields = cases(without)
    plain = run(family, fields=fields)[0]
    assert all(p[0] != w for p, w in zip(plain[:3], without))  # every rule bites
    second, third = plain[1][0], plain[2][0]
    stop = fields[1]["stop_token_ids"][0]
    assert stop not in second[:5]  # min_tokens 6: the stop token is banned before the 6th
    assert set(third) <= set(fields[2]["allowed_token_ids"])
    (a, b), (c,) = fields[2]["bad_words_token_ids"]
    assert c not in third and (a, b) not in set(zip(third, third[1:]))
    assert len(plain[3][0]) == 7 and plain[3][4] == "length"
    assert all(len(top) == 3 for top in plain[0][2])  # top-3 at every token
    assert len(plain[0][3]) == len(PROMPTS[0]) + len(plain[0][0]) - 1  # every computed position
    return fields, plain


@pytest.fixture(scope="module")
def gpt_oss():
    return oracle("gpt_oss")


def rotated():
    decoder = load_decoder(FIXTURES / "gpt_oss")
    head = decoder.lm_head.weight
    head[...] = jnp.roll(head[...], 1, axis=0)
    return decoder


@pytest.mark.parametrize(
    ("draft", "k"),
    [
        ("self", 2),
        pytest.param("qwen3", 1, marks=pytest.mark.slow),
        ("qwen3", 4),
        pytest.param("self", 4, marks=pytest.mark.slow),
        pytest.param("rotated", 2, marks=pytest.mark.slow),
    ],
)
def test_every_field_through_a_draft_model(gpt_oss, draft, k, tmp_path):
    fields, plain = gpt_oss
    model = {
        "self": lambda: load_decoder(FIXTURES / "gpt_oss"),
        "qwen3": lambda: load_decoder(FIXTURES / "qwen3"),
        "rotated": rotated,
    }[draft]()
    got, e = run("gpt_oss", k, model, fields=fields, trace=tmp_path / "t.jsonl")
    assert_same(got, plain)
    s = e.scheduler
    assert s.draft_tokens and sum(s.acceptance.values()) == s.draft_tokens // k
    if draft == "self":  # the draft sees the same rules: it proposes what the target keeps
        assert s.accepted_tokens > s.draft_tokens // 2
    for r in e.requests.values():
        assert r.spec_accepted <= r.spec_drafted


def test_every_field_through_a_retraction_mid_request(gpt_oss, tmp_path):
    """Retracted after a few rounds, the penalized request (its counts), the ruled one
    (min_tokens, its stop id) and the kept logits resume where they were."""
    fields, plain = gpt_oss
    draft = load_decoder(FIXTURES / "qwen3")
    got, e = run("gpt_oss", 2, draft, fields=fields, trace=tmp_path / "t.jsonl", retract_after=3)
    assert e.scheduler.retractions == 2
    assert_same(got, plain)


@pytest.fixture(scope="module")
def mimo():
    return oracle("mimo_v2_flash_mtp")


@pytest.mark.parametrize(
    "k", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)]
)
def test_every_field_through_the_checkpoints_mtp_layer(mimo, k, tmp_path):
    fields, plain = mimo
    got, e = run("mimo_v2_flash_mtp", k, fields=fields, mtp=True, trace=tmp_path / "t.jsonl")
    assert_same(got, plain)
    assert e.scheduler.draft_tokens


def test_sampled_rounds_follow_plain_decoding_with_penalties():
    """Many seeds of one prompt, sampled with penalties, top-p and min-p on: the first and
    third tokens' distributions are plain decoding's (two-sample chi-square) with a draft of
    another family, which keeps some proposals and rejects others."""
    params = SamplingParams(
        temperature=1.3,
        top_p=0.95,
        min_p=0.01,
        repetition_penalty=1.8,
        presence_penalty=0.8,
        frequency_penalty=0.5,
        max_tokens=3,
        ignore_eos=True,
    )
    seeds = range(300)

    def tokens(k, draft):
        e, _ = engine("gpt_oss", k, draft, gib=0.01, max_running=64)
        rids = [e.add_request(PROMPTS[0][:6], dataclasses.replace(params, seed=s)) for s in seeds]
        e.run()
        check_clean(e)
        return np.asarray([e.requests[r].output for r in rids]), e

    plain, _ = tokens(0, None)
    for draft in ("qwen3",):
        got, e = tokens(2, load_decoder(FIXTURES / draft))
        assert e.scheduler.accepted_tokens > 0
        for j in (0, 2):
            values = np.union1d(plain[:, j], got[:, j])
            table = [[np.sum(x[:, j] == v) for v in values] for x in (plain, got)]
            keep = np.sum(table, axis=0) >= 5
            table = np.asarray(table)[:, keep]
            assert table.shape[1] >= 3, table  # a spread distribution, not one token
            assert stats.chi2_contingency(table).pvalue > 1e-3, (draft, j, table)
