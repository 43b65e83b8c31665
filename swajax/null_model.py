"""A model that does no attention math: it emits deterministic tokens so the engine's memory
system can run production-size configurations (the presets) on a CPU."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class ForwardBatch:
    """What a model needs for one step (the engine builds it)."""

    tokens: np.ndarray  # i32[T]: new tokens, request after request
    positions: np.ndarray  # i32[T]
    sample_index: np.ndarray  # i32[R']: flat index of the token each sampled request ends on
    meta: object = None  # AttentionMetadata for models that read KV; None for the null model


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

    def forward(self, pools, batch: ForwardBatch):
        """Logits with all the mass on `next_token` for each sampled row."""
        rows = batch.sample_index
        nxt = self.next_token(batch.tokens[rows], batch.positions[rows])
        logits = np.full((len(rows), self.vocab_size), -30.0, np.float32)
        logits[np.arange(len(rows)), nxt] = 30.0
        return logits, pools
