"""A model that does no attention math: it emits deterministic tokens so the engine's memory
system can run production-size configurations (the presets) on a CPU."""

from __future__ import annotations

import numpy as np

from swajax.serving.batch import ForwardBatch


class NullModel:
    needs_kv = False

    def __init__(self, vocab_size: int = 1024, seed: int = 0):
        self.vocab_size, self.seed = vocab_size, seed

    def init_pools(self, sizes):
        return None

    def next_token(self, token, position):
        """The token after `token` at `position` (a fixed hash of both)."""
        mixed = (
            np.asarray(token, np.int64) * 1_103_515_245
            + np.asarray(position, np.int64) * 12_345
            + self.seed
        )
        return (mixed >> 4) % self.vocab_size

    def forward_and_sample(self, pools, batch: ForwardBatch, meta, *, return_logits=False):
        """`next_token` of each sampled row, with logprob 0 (all the mass on it); host only."""
        if return_logits:
            raise ValueError("the null model computes no logits")
        rows = batch.logit_index[batch.sample_index]
        # The sampled row is the token at position sample_position - 1.
        tokens = self.next_token(batch.tokens[rows], batch.sample_positions - 1).astype(np.int32)
        return pools, (tokens, np.zeros(len(tokens), np.float32), None)
