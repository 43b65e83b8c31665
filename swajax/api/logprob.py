"""vLLM's `Logprob` (logprob, rank, decoded_token) as the entries of `CompletionOutput.logprobs`
and `RequestOutput.prompt_logprobs`: a float subclass, so the float swajax returned before (its
sums, comparisons, formatting) is still what a script gets, with vLLM's three attributes beside.
Host code."""

from __future__ import annotations


class Logprob(float):
    """A logprob with its rank in the distribution it was drawn from (1: the likeliest) and its
    token's text (the step returns the sampled token's rank beside the N likeliest; a prompt
    position's ranks come from its kept logits)."""

    rank: int | None
    decoded_token: str | None

    def __new__(cls, logprob: float, rank: int | None, decoded_token: str | None):
        x = super().__new__(cls, logprob)
        x.rank, x.decoded_token = rank, decoded_token
        return x

    @property
    def logprob(self) -> float:
        return float(self)

    def __repr__(self) -> str:
        return (
            f"Logprob(logprob={float(self)!r}, rank={self.rank!r}, "
            f"decoded_token={self.decoded_token!r})"
        )


def ranked(chosen: int, chosen_lp: float, top: dict[int, float] | None, decode) -> dict:
    """{token: Logprob} of one position: the chosen token and the top-N (`top`, N likeliest
    first), ranked by logprob (the chosen token's rank: the step's, `top.rank`, where it has
    one); `decode`: ids -> text (or None)."""
    order = sorted((top or {}).items(), key=lambda kv: -kv[1])
    rank = {t: i + 1 for i, (t, _) in enumerate(order)}
    text = (lambda t: decode([t])) if decode is not None else (lambda t: None)
    own = getattr(top, "rank", None)
    out = {chosen: Logprob(chosen_lp, own if own is not None else rank.get(chosen), text(chosen))}
    for t, lp in order:
        if t != chosen:
            out[t] = Logprob(lp, rank[t], text(t))
    return out
