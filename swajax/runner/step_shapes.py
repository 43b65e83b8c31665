"""A server's step shapes: every static of a step program from a few enumerated sizes, so the
whole set can be compiled before the server says it is ready (host code).

The runner's default shapes follow each batch closely (sampled rows, sampling features, rule
widths, edit counts, query blocks and SWA page spans each bucketed on their own), which is the
cheapest step for an offline run but makes the programs a mixed load reaches the product of
all those choices: a fresh server compiled 39 step programs inside its serving loop, each one a
stall of every client. Here the step's sizes depend on four enumerated values only, the step's
kind and, per kind:

- `r`: the request rows of a decode step or round, a power of two from the runner's minimum to
  the most running requests (an extend's are always the most);
- `t`: an extend's new tokens, a power of two from 64 to the per-step chunk budget;
- `f`: the full pages of the longest request, the buckets `metadata_shape` uses, up to the
  context;
- whether the step keeps logits (an echo's prompt logprobs).

Everything else is fixed at its largest: every sampled row padded to `r`, the sampling features
all compiled in (penalties, the draw, token rules of up to `RULE_WIDTH` entries, the top-N of
`max_logprobs`), the releases and re-pointed entries of a step at `edits` (more go through a
separate program of the same size first), the query blocks and SWA pages at what `t` tokens can
span. A request outside the set (more rule entries, bad words of several tokens, a host tier's
copies) still runs: its program compiles when first needed and `/metrics` counts it.
"""

from __future__ import annotations

import dataclasses
import itertools

from swajax.arith import bucket, ceil_div
from swajax.attention.metadata import MetadataShape, default_block_q, full_pages_bucket
from swajax.runner.step_inputs import MIN_TOKENS

RULE_WIDTH = 16  # token-rule entries (logit bias, allowed and banned ids) per request
SEED_CHUNK = 1024  # penalty counts loaded per program call, ahead of a step


@dataclasses.dataclass(frozen=True)
class FixedShapes:
    page_size: int
    window: int
    min_reqs: int  # the fewest request rows a step pads to
    max_running: int
    max_context: int
    chunk_tokens: int  # new tokens one extend step may carry (the chunked-prefill budget)
    max_logprobs: int
    decode_steps: int = 1  # multi-step decode's N (1: no rounds)
    draft_tokens: int = 0  # speculative rounds' k (0: none)
    vocab: bool = True  # the model has a vocabulary (penalties can be counted)

    # ----------------------------------------------------------------- the enumerated sizes

    def request_rows(self, n: int) -> int:
        return bucket(n, self.min_reqs)

    def row_sizes(self) -> list[int]:
        return _powers(self.min_reqs, self.request_rows(self.max_running))

    def extend_tokens(self, n: int) -> int:
        return bucket(n, MIN_TOKENS)

    def token_sizes(self) -> list[int]:
        return _powers(MIN_TOKENS, self.extend_tokens(self.chunk_tokens))

    def page_sizes(self) -> list[int]:
        low = full_pages_bucket(1, self.page_size)
        return _powers(low, full_pages_bucket(self.max_context, self.page_size))

    @property
    def edits(self) -> int:
        """Releases and re-pointed `req_to_token` entries one step carries."""
        return bucket(2 * self.chunk_tokens, 256)

    @property
    def top_logprobs(self) -> int:
        return bucket(self.max_logprobs, 1) if self.max_logprobs else 0

    @property
    def round_len(self) -> int:
        """Positions per request of a round (a verify round's k + 1, or N), 1 without rounds."""
        return self.draft_tokens + 1 if self.draft_tokens else self.decode_steps

    # ----------------------------------------------------------------- metadata shapes

    def _swa_min(self) -> int:
        """SWA pages a single-token step spans: every decode shares this width."""
        return bucket(ceil_div(self.window, self.page_size) + 1, 2)

    def _span(self, extend: int) -> int:
        """SWA pages the queries of `extend` new tokens of one request (and their window) can
        touch."""
        return bucket((self.window + extend - 1) // self.page_size + 2, self._swa_min())

    def decode(self, r: int, f: int) -> MetadataShape:
        """A decode step's metadata (one query per request)."""
        return MetadataShape(self.window, 1, r, f, self._swa_min(), r)

    def extend(self, r: int, t: int, f: int, longest: int | None = None) -> MetadataShape:
        """An extend of at most `t` tokens over `r` rows (`longest`: the most one request
        extends, if less than t: a round's)."""
        longest = longest or t
        q = default_block_q(longest)
        blocks = bucket(r * ceil_div(longest, q), 1) if longest < t else bucket(t // q + r, 1)
        return MetadataShape(self.window, q, t, f, self._span(longest), blocks)

    def round(self, r: int, f: int) -> MetadataShape:
        """The commit's metadata of a round: `round_len` positions for each of `r` rows."""
        n = self.round_len
        return self.extend(r, bucket(r * n, 1), f, longest=n)

    def keys(self):
        """Every (kind, r, t, f, keeps logits) a server can reach: kind "extend", "decode", or
        "round" (multi-step or speculative); t is 0 but for an extend."""
        rs, fs = self.row_sizes(), self.page_sizes()
        for t, f, logits in itertools.product(self.token_sizes(), fs, (False, True)):
            yield "extend", rs[-1], t, f, logits  # (an extend pads to the most rows)
        for r, f, logits in itertools.product(rs, fs, (False, True)):
            yield "decode", r, 0, f, logits
        if self.round_len > 1:
            for r, f in itertools.product(rs, fs):
                yield "round", r, 0, f, False


def _powers(low: int, high: int) -> list[int]:
    """low, 2 low, 4 low, ... up to high (both powers of two times the same base)."""
    out = [low]
    while out[-1] < high:
        out.append(out[-1] * 2)
    return out
