"""OpenAI's shapes from a job's events: a sample that failed makes the response an error with
its reason (the handler answers 500; a stream ends with an error event), the others' text is
kept apart by choice index."""

from swajax.api.sample_stream import TokenEvent
from swajax.server.protocol import CompletionRequest
from swajax.server.responses import Completion


class Sample:
    def __init__(self, index, sample, prompt_len=2, cached_tokens=0):
        self.index, self.sample, self.prompt_len = index, sample, prompt_len
        self.cached_tokens = cached_tokens


def decode(ids):
    return bytes(ids).decode("utf-8", errors="replace")


def test_a_failed_sample_is_an_error_with_its_reason():
    body = CompletionRequest(prompt=["ab", "cd"], n=1, max_tokens=2)
    shape = Completion(decode, "m", body, [[97, 98], [99, 100]], echo_only=False)
    ok, bad = Sample(0, 0), Sample(1, 0)
    shape.take(
        (
            "tokens",
            ok,
            [TokenEvent(120, -0.1, None, "x", None), TokenEvent(121, -0.2, None, "y", "length")],
        )
    )
    chunks = shape.chunks(
        ("done", [(ok, "length", None), (bad, "abort: error: ValueError: boom", None)])
    )
    assert shape.failure() == "abort: error: ValueError: boom"
    assert chunks[-1]["error"]["message"] == "abort: error: ValueError: boom"
    whole = shape.body()
    assert whole["choices"][0]["text"] == "xy" and whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"]["completion_tokens"] == 2 and whole["usage"]["prompt_tokens"] == 4
