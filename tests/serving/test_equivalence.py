"""The memory system never changes what the model computes (the oracle property).

For two families, a first request and then a second one sharing its prefix run under every
memory setting: hybrid memory on / off, prefix cache on / off, page size 1 / 16, chunked prefill
16 / 64 / off, eviction interval 1 / 128, attention xla / pallas (interpret). Each setting is
varied alone from a baseline; greedy tokens must be identical and logits within 1e-5.
"""

import numpy as np
import pytest
from helpers import FIXTURES

from swajax.api import EngineSpec, make_engine
from swajax.models import load_decoder
from swajax.serving.sampling_params import SamplingParams

BASE = EngineSpec.of(
    kv_budget_gib=0.0005, page_size=4, chunk_size=16, eviction_interval=1, max_context=128
)
VARIANTS = {
    "hybrid off": dict(hybrid_memory=False),
    "prefix cache off": dict(prefix_cache=False),
    "page size 1": dict(page_size=1),
    "page size 16": dict(page_size=16),
    "chunk 64": dict(chunk_size=64),
    "chunk off": dict(chunk_size=None),
    "eviction interval 128": dict(eviction_interval=128),
    "pallas": dict(attention="pallas"),
}
PROMPT = [
    5,
    17,
    99,
    3,
    42,
    64,
    8,
    120,
    33,
    71,
    2,
    90,
    15,
    56,
    101,
    27,
    88,
    11,
    60,
    45,
    77,
    30,
    119,
    9,
    14,
    70,
    81,
    3,
    7,
    66,
]
SECOND = PROMPT[:24] + [21, 44, 90, 12]


def run(decoder, setup):
    import dataclasses

    engine = make_engine(decoder, setup)
    outputs = []
    for prompt in (PROMPT, SECOND):  # the second request finds the first's prefix cached
        rid = engine.add_request(
            prompt, SamplingParams(temperature=0.0, max_tokens=12), keep_logits=True
        )
        engine.run()
        req = engine.requests[rid]
        outputs.append((req.output, np.stack(req.logits)))
    hits = engine.scheduler.hit_tokens
    return outputs, hits, dataclasses.asdict(setup)


@pytest.fixture(scope="module")
def family(request):
    decoder = load_decoder(FIXTURES / request.param)
    return decoder, run(decoder, BASE)


# In the default run: the settings that change how attention reads the pools, for GPT-OSS
# (sinks, MoE); the rest of the matrix, and Gemma 3 (soft caps, sandwich norms: its Pallas soft
# cap is checked against the dense oracle in tests/attention), with `-m slow`.
DEFAULT = {
    "gpt_oss": ("hybrid off", "page size 16", "chunk 64", "pallas"),
    "gemma3": (),
}
CASES = [
    (f, v) if v in DEFAULT[f] else pytest.param(f, v, marks=pytest.mark.slow)
    for f in DEFAULT
    for v in VARIANTS
]


@pytest.mark.parametrize("family, variant", CASES, indirect=["family"])
def test_memory_settings_do_not_change_outputs(family, variant):

    decoder, (base, base_hits, _) = family
    outputs, hits, _ = run(decoder, BASE.replace(**VARIANTS[variant]))
    for (tokens_a, logits_a), (tokens_b, logits_b) in zip(base, outputs):
        assert tokens_a == tokens_b
        # Logits exist for computed positions only: a longer cache hit computes fewer. Both end
        # at the same position, so compare the common tail.
        n = min(len(logits_a), len(logits_b))
        logits_a, logits_b = logits_a[-n:], logits_b[-n:]
        err = np.max(np.abs(logits_a - logits_b)) / np.max(np.abs(logits_a))
        assert err <= 1e-5, f"{variant}: relative logit difference {err:.2e}"
    if variant == "prefix cache off":
        assert hits == 0 < base_hits  # the baseline really reused the cached prefix
