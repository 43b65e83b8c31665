"""Stop strings (host code): a request's output watched as text, cut where a stop string starts.

The output is decoded after every step; a stop string completed by the new tokens ends the
request (once the output has min_tokens tokens: one completed earlier does not count). The
text keeps everything before the stop string (vLLM's and transformers' default: the string
itself is not returned), the tokens keep up to the one that completed it; the rest of a
speculative round, or of a step launched ahead, is dropped, and its KV goes back
(`Engine.stop(keep=)`). For streaming, text that could still turn into a stop string (a tail
as long as the longest one, less a character) is held back until the next tokens decide it.
"""

from __future__ import annotations


class StopWatch:
    """One request's stop strings over its growing output."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.searched = 0  # text before this offset holds no stop string
        self.cut: tuple[int, str] | None = None  # (tokens kept, text) once a stop matched
        self.matched: str | None = None  # the stop string that matched

    def check(self, output: list[int], text: str, ends: list[int], min_tokens: int = 0) -> bool:
        """Whether a stop string has now appeared in `text` (the decoded `output`; `ends[m-1]`:
        the length of the text of its first m tokens); sets `cut`. A stop string counts only
        when the token completing it is at least the `min_tokens`-th."""
        if self.cut is not None:
            return True
        if not self.stops or not output:
            return False
        start = max(0, self.searched - self.hold)
        self.searched = len(text)
        found = []
        for stop in self.stops:
            at = text.find(stop, start)
            while at >= 0:
                # The fewest tokens whose text holds the whole stop string: later tokens only
                # add to the text (decoding is prefix-stable at a token).
                end = at + len(stop)
                kept = next(m for m in range(1, len(output) + 1) if ends[m - 1] >= end)
                if kept >= min_tokens:
                    found.append((at, stop, kept))
                    break
                at = text.find(stop, at + 1)
        if not found:
            return False
        at, matched, kept = min(found)
        self.cut = (kept, text[:at])
        self.matched = matched
        return True

    def visible(self, text: str, done: bool) -> str:
        """The part of `text` a stream may show now: all of it once the request is done (cut
        at the stop string), else all but the tail that could begin one."""
        if self.cut is not None:
            return self.cut[1]
        if done or not self.stops:
            return text
        return text[: max(0, len(text) - self.hold)]
