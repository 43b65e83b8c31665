"""A model that does no attention math: it emits deterministic tokens so the engine's memory
system can run production-size configurations (the presets) on a CPU."""

from __future__ import annotations

import numpy as np

from swajax.serving.batch import ForwardBatch


class NullModel:
    """A `serving.batch.Model` without KV: the runner calls it outside its fused program."""

    needs_kv = False
    fused_forward = None
    state_sharding = None  # the runner's state on the default device

    def __init__(
        self, vocab_size: int = 1024, seed: int = 0, acceptance: float = 1.0, overlap: bool = False
    ):
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
        self.vocab_size, self.seed = vocab_size, seed
        # Speculative decoding: the chance that an emulated draft's token is accepted.
        self.acceptance = acceptance
        # Overlap scheduling emulated (decode step n + 1 planned before n's result is taken):
        # the allocator sees what a fused model's would. Off by default, so the simulator's
        # numbers stay those of plain steps.
        self.overlap = overlap

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

    def verify(self, plan, k: int):
        """An emulated verify round: the target's tokens are the `next_token` chain from each
        pending token (so outputs equal plain decoding's), and each draft token is accepted
        with probability `acceptance` (a fixed hash of the position decides); a multi-step
        round (not `speculative`) keeps all k + 1."""
        n = plan.seq_lens - plan.prefix_lens  # positions per request (a round: k + 1 each)
        t = plan.forward.tokens[np.cumsum(n) - n]
        pos = plan.prefix_lens.astype(np.int64)
        greedy = np.zeros((len(t), k + 1), np.int32)
        for j in range(k + 1):
            t = self.next_token(t, pos + j)
            greedy[:, j] = t
        draws = (self.next_token(pos[:, None] + np.arange(k), 7) % 1000) / 1000.0
        accepted = np.cumprod(draws < self.acceptance, axis=1).sum(axis=1).astype(np.int32)
        if not plan.round.speculative:  # multi-step decode: every step a request took is kept
            accepted = (n - 1).astype(np.int32)
        return greedy, np.zeros(greedy.shape, np.float32), accepted

    def forward_and_sample(
        self, pools, batch: ForwardBatch, meta, *, return_logits=False, penalties=None, mode=None
    ):
        """`next_token` of each sampled row, with logprob 0 (all the mass on it); host only.
        Returns (pools, penalties, (tokens, logprobs, logits, top ids, top logprobs))."""
        if return_logits:
            raise ValueError("the null model computes no logits")
        rows = batch.logit_index[batch.sample_index]
        # The sampled row is the token at position sample_position - 1.
        tokens = self.next_token(batch.tokens[rows], batch.sample_positions - 1).astype(np.int32)
        return pools, None, (tokens, np.zeros(len(tokens), np.float32), None, None, None)
