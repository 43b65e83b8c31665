"""What a request must pass before any handler sees it (a pure ASGI middleware): the API key on
the `/v1/` routes and on `/tokenize` and `/detokenize`, and a bound on the body's bytes,
counted as they arrive so that an oversized body is refused (413) without being read whole or
parsed on the event loop.

The key is compared in constant time; `/health` and `/metrics` stay open, as in vLLM, so load
balancers and scrapers need no secret. Refusals are in OpenAI's error shape."""

from __future__ import annotations

import hmac
import json

KEYED = ("/v1/", "/tokenize", "/detokenize")  # every route that does work for its caller
RETRY_AFTER_SECONDS = 5  # a stopping server's 503: ask again (another replica, a restart)


def error_body(status: int, message: str, kind: str, code=None) -> bytes:
    """OpenAI's error object: {"error": {message, type, param, code}}."""
    error = {"message": message, "type": kind, "param": None, "code": code or status}
    return json.dumps({"error": error}).encode()


class Gate:
    """ASGI middleware: `api_key` (None: no key) on the KEYED routes, `max_body` bytes on every
    body."""

    def __init__(
        self,
        app,
        *,
        api_key: str | None,
        max_body: int,
        max_values: int | None = None,
        stopping=lambda: False,
    ):
        self.app, self.api_key, self.max_body = app, api_key, max_body
        self.max_values = max_values  # a body with more commas is refused before parsing
        self.stopping = stopping  # () -> bool: the server stops; every new request gets 503

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.stopping():
            retry = [(b"retry-after", str(RETRY_AFTER_SECONDS).encode())]
            message = "the server is shutting down"
            return await _reply(send, 503, message, "server_error", headers=retry)
        headers = dict(scope.get("headers") or [])
        if self.api_key is not None and scope["path"].startswith(KEYED):
            given = headers.get(b"authorization", b"").decode("latin-1")
            expected = f"Bearer {self.api_key}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                message = "a valid API key is required: header 'Authorization: Bearer <key>'"
                return await _reply(send, 401, message, "invalid_request_error", "invalid_api_key")
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            return await self._too_large(send, int(declared))
        body, more = bytearray(), True
        while more:  # the body, chunk by chunk, never past the limit
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                return await self._too_large(send, None)
        if self.max_values is not None and body.count(b",") > self.max_values:
            # Parsing a few million numbers holds the event loop (and the GIL) for a quarter of a
            # second; no request can use more tokens than this, so it is refused unread.
            message = (
                f"the request body holds over {self.max_values:,} values; one request takes at "
                "most --max-waiting sequences of the model's context"
            )
            return await _reply(send, 400, message, "invalid_request_error")
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    async def _too_large(self, send, size: int | None):
        got = f"{size:,} bytes" if size is not None else "more bytes than that"
        message = (
            f"the request body holds {got}; the limit is {self.max_body:,} bytes (--max-body-mib)"
        )
        await _reply(send, 413, message, "invalid_request_error")


async def _reply(send, status: int, message: str, kind: str, code=None, headers=()) -> None:
    body = error_body(status, message, kind, code)
    length = str(len(body)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", length), *headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
