"""Two turns sharing an 80-token prefix, for the tests of what a later turn reads from the
prefix cache (host tier, snapshots, deterministic mode): FIRST and OTHER leave SHARED ending at
a branch point, so SECOND's hit ends exactly there."""

import numpy as np

from swajax.api import EngineSpec
from swajax.serving.sampling_params import SamplingParams

# Small pools (evictions and tombstones), eviction every step, chunks of 8.
SETUP = EngineSpec.of(
    kv_budget_gib=0.001, page_size=4, chunk_size=8, eviction_interval=1, max_context=256
)
SHARED = [(7 * i + 3) % 120 + 1 for i in range(80)]
FIRST, OTHER = SHARED + [5, 6, 7, 8, 9, 10, 11, 12], SHARED + [15, 16, 17, 18]
SECOND = SHARED + [11, 45, 90, 2, 67, 31, 8, 100]
PARAMS = SamplingParams(temperature=0.0, max_tokens=6)


def run(engine, prompt):
    """(tokens, every kept logits row, cached tokens) of `prompt` run greedily to the end."""
    rid = engine.add_request(prompt, PARAMS, keep_logits=True)
    engine.run()
    req = engine.requests[rid]
    return req.output, np.stack(req.logits), req.cached_tokens
