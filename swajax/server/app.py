"""The OpenAI-compatible HTTP application (FastAPI): /v1/completions, /v1/chat/completions
(streamed as server-sent events or not), /v1/models, /health and /metrics.

Every handler only translates: a body is validated (pydantic: a bad or unknown field is a 400
naming it), turned into token ids and `SamplingParams`, submitted to the one `EngineLoop`, and
its events are written back in OpenAI's shapes (`server/responses.py`). A client that goes
away has its job cancelled (its requests aborted, their KV returned).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException

from swajax.api.chat_messages import flattened
from swajax.errors import InputError
from swajax.server import responses as out
from swajax.server.engine_loop import (
    STEP_BOUND_SECONDS,
    EngineLoop,
    Job,
    QueueFull,
    ShuttingDown,
    TooLarge,
)
from swajax.server.gate import RETRY_AFTER_SECONDS, Gate
from swajax.server.metrics import Metrics
from swajax.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    prompt_list,
    template_variables,
)
from swajax.server.template_worker import TemplateWorker
from swajax.version import __version__

MAX_BODY_MIB = 8.0  # a million-token prompt as ids is about 7 MiB of JSON
TOKENIZE_SECONDS = 30.0  # a body at the limit tokenizes in well under a second


def error(status: int, message: str, kind: str = "invalid_request_error", param=None):
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def make_app(
    llm,
    *,
    model_name: str,
    folder=None,
    max_waiting: int = 256,
    api_key: str | None = None,
    max_body_mib: float = MAX_BODY_MIB,
    aliases: tuple[str, ...] = (),
    metrics_prefix: str = "swajax:",
    chat_template: str | None = None,
) -> FastAPI:
    """The application over `llm` (a `swajax.LLM`); `folder`: its checkpoint folder (for the
    chat template), None for the embedded model; `api_key`: required on `/v1/*` as a bearer
    token (None: open); `max_body_mib`: the largest request body read; `aliases`: other names
    requests may give the model (vLLM's `--served-model-name A B`); `metrics_prefix`: of every
    /metrics name ("vllm:": vLLM's own names); `chat_template`: a template's text that chat
    renders instead of the checkpoint's (`--chat-template`)."""
    loop = EngineLoop(llm, max_waiting=max_waiting)
    metrics = Metrics(llm.engine, loop, model_name, metrics_prefix)
    templates = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        loop.start()
        yield
        aborted = loop.shutdown()  # in-flight requests end as aborted; nothing stays held
        for worker in templates.values():
            if worker is not None:
                worker.close()
        if aborted is None:
            line = (
                f"stopped; the engine's step in progress outlived {STEP_BOUND_SECONDS:g} s "
                "and was left (every client had its answer)"
            )
        else:
            running = len(llm.engine.scheduler.running)
            line = f"stopped; {aborted} request(s) in flight aborted, {running} running"
        print(f"swajax serve: {line}", file=sys.stderr, flush=True)

    app = FastAPI(title="swajax", lifespan=lifespan)
    app.state.loop = loop
    app.add_middleware(
        Gate,
        api_key=api_key,
        max_body=int(max_body_mib * 2**20),
        # every token a request can queue (plus its other fields' values)
        max_values=max_waiting * llm.engine.options.max_context + 4096,
        stopping=lambda: loop.stopping,
    )

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, exc: RequestValidationError):
        first = exc.errors()[0]
        if first.get("type") == "json_invalid":
            return error(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error')}")
        field = ".".join(str(x) for x in first["loc"] if x != "body")
        return error(400, f"{field}: {first['msg']}", param=field)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):  # 404, 405, ...: OpenAI's shape too
        return error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

    @app.exception_handler(Exception)
    async def server_error(_request, exc: Exception):
        return error(500, f"{type(exc).__name__}: {exc}", "server_error")

    def check_length(text: str) -> None:
        """Refuse a text sure to exceed the context before tokenizing it (a few megabytes of
        text make millions of ids, built while holding the GIL)."""
        limit = llm.engine.options.max_context
        if (least := llm.tokenizer.fewest_tokens(text)) > limit:
            raise InputError(f"the prompt is {least} tokens, over the context limit {limit}")

    async def tokenize(texts: list) -> list[list[int]]:
        for text in texts:
            if isinstance(text, str):
                check_length(text)

        def encode():
            return [llm.tokenizer.encode(p) if isinstance(p, str) else p for p in texts]

        try:
            return await asyncio.wait_for(asyncio.to_thread(encode), TOKENIZE_SECONDS)
        except TimeoutError:
            message = f"tokenizing the prompt took more than {TOKENIZE_SECONDS:g} s"
            raise InputError(message) from None

    async def infill(prompt, suffix: str) -> list[list[int]]:
        """`suffix`: the prompt (text) and the suffix as one fill-in-the-middle prompt."""
        if not isinstance(prompt, str):
            raise InputError("suffix needs the prompt as one text (fill in the middle)")

        def encode():
            return [llm.tokenizer.infill(prompt, suffix)]

        try:
            return await asyncio.wait_for(asyncio.to_thread(encode), TOKENIZE_SECONDS)
        except TimeoutError:
            message = f"tokenizing the prompt took more than {TOKENIZE_SECONDS:g} s"
            raise InputError(message) from None

    async def render(messages: list[dict], variables: dict | None = None) -> str:
        if "t" not in templates:
            given = folder is not None or chat_template is not None
            templates["t"] = TemplateWorker(folder, source=chat_template) if given else None
        worker = templates["t"]
        if worker is None:
            raise InputError("the embedded model has no chat template: use /v1/completions")
        return await worker.render_async(flattened(messages), variables)

    def unknown_model(name: str | None):
        """A request naming another model is refused, as OpenAI's and vLLM's servers do."""
        if name is None or name == model_name or name in aliases:
            return None
        return error(
            404,
            f"the model {name!r} does not exist; this server serves {model_name!r}",
            param="model",
        )

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.post("/tokenize")
    async def tokenize_route(body: TokenizeRequest):
        if (refused := unknown_model(body.model)) is not None:
            return refused
        try:
            if (body.prompt is None) == (body.messages is None):
                raise InputError("give one of 'prompt' or 'messages'")
            if body.messages is not None:
                messages = [m.model_dump(exclude_none=True) for m in body.messages]
                text = await render(messages, template_variables(body))
                ids = await asyncio.to_thread(llm.tokenizer.encode_rendered, text)
            elif body.add_special_tokens:
                (ids,) = await tokenize([body.prompt])
            else:
                check_length(body.prompt)
                ids = await asyncio.to_thread(llm.tokenizer.encode_rendered, body.prompt)
            limit = llm.engine.options.max_context
            if len(ids) > limit:  # (and the answer stays small enough to encode on the loop)
                raise InputError(f"the prompt is {len(ids)} tokens, over the context limit {limit}")
        except (InputError, ValueError) as e:
            return error(400, str(e))
        return {"count": len(ids), "max_model_len": limit, "tokens": ids, "token_strs": None}

    @app.post("/detokenize")
    async def detokenize_route(body: DetokenizeRequest):
        if (refused := unknown_model(body.model)) is not None:
            return refused
        vocab = llm.engine.model.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            return error(400, f"tokens: {bad[0]} is outside the vocabulary [0, {vocab})")
        return {"prompt": await asyncio.to_thread(llm.tokenizer.decode, body.tokens)}

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "owned_by": "swajax"}
                for name in (model_name, *aliases)
            ],
        }

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type=metrics.content_type)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        if (refused := unknown_model(body.model)) is not None:
            return refused
        try:
            if body.max_tokens == 0 and not body.echo:
                raise InputError("max_tokens: 0 generates nothing; it is allowed only with echo")
            if body.best_of is not None and body.best_of > body.n and body.stream:
                raise InputError(
                    f"best_of ({body.best_of}) > n ({body.n}) cannot stream: the best are "
                    "known only at the end"
                )
            if body.suffix is not None:
                prompts = await infill(body.prompt, body.suffix)
            else:
                prompts = await tokenize(prompt_list(body.prompt))
            echo_only = body.echo and body.max_tokens == 0
            params = body.sampling(max(body.max_tokens or 16, 1), body.logprobs or 0, body.best_of)
            params = _with_eos(llm, params, body.ignore_eos)
        except (InputError, ValueError) as e:
            return error(400, str(e))
        job = Job(prompts, params, keep_logits=body.echo, loop=asyncio.get_running_loop())
        shape = out.Completion(llm.tokenizer.decode, model_name, body, prompts, echo_only)
        return await _serve(loop, job, request, shape, body.stream)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        if (refused := unknown_model(body.model)) is not None:
            return refused
        try:
            messages = [m.model_dump(exclude_none=True) for m in body.messages]
            text = await render(messages, template_variables(body))
            max_tokens = body.max_completion_tokens or body.max_tokens or 256
            params = body.sampling(max_tokens, (body.top_logprobs or 1) if body.logprobs else 0)
            params = _with_eos(llm, params, body.ignore_eos)
            prompt = await asyncio.to_thread(llm.tokenizer.encode_rendered, text)
        except (InputError, ValueError) as e:
            return error(400, str(e))
        job = Job([prompt], params, keep_logits=False, loop=asyncio.get_running_loop())
        shape = out.Chat(llm.tokenizer.decode, model_name, body)
        return await _serve(loop, job, request, shape, body.stream)

    return app


def shutting_down() -> JSONResponse:
    response = error(503, "the server is shutting down", "server_error")
    response.headers["retry-after"] = str(RETRY_AFTER_SECONDS)
    return response


def _with_eos(llm, params, ignore_eos: bool):
    """The checkpoint's eos ids join the request's stop ids unless `ignore_eos`."""
    if ignore_eos or not llm.stop_token_ids:
        return params
    stops = tuple(dict.fromkeys(params.stop_token_ids + tuple(llm.stop_token_ids)))
    return dataclasses.replace(params, stop_token_ids=stops)


async def _serve(loop: EngineLoop, job: Job, request: Request, shape, stream: bool):
    try:
        loop.submit(job)
    except TooLarge as e:
        return error(400, str(e))
    except QueueFull as e:
        return error(429, str(e), "rate_limit_error")
    except ShuttingDown:
        return shutting_down()
    first = await job.queue.get()
    if first[0] == "error" and isinstance(first[1], ShuttingDown):
        return shutting_down()
    if first[0] == "error":
        return error(400, str(first[1]))
    if stream:
        return StreamingResponse(_events(loop, job, request, shape), media_type="text/event-stream")
    try:
        while True:
            try:
                message = await asyncio.wait_for(job.queue.get(), timeout=0.5)
            except TimeoutError:
                if await request.is_disconnected():
                    loop.cancel(job)
                    return error(499, "client disconnected")
                continue
            shape.take(message)
            if message[0] == "done":
                break
    except asyncio.CancelledError:
        loop.cancel(job)
        raise
    failed = shape.failure()
    if failed is not None:
        return error(500, failed, "server_error")
    return JSONResponse(shape.body())


async def _events(loop: EngineLoop, job: Job, request: Request, shape):
    """Server-sent events: a chunk per token as its step finishes, then [DONE]."""
    finished = False
    try:
        for chunk in shape.first_chunks():
            yield f"data: {json.dumps(chunk)}\n\n"
        while True:
            message = await job.queue.get()
            for chunk in shape.chunks(message):
                yield f"data: {json.dumps(chunk)}\n\n"
            if message[0] == "done":
                break
        finished = True
        yield "data: [DONE]\n\n"
    finally:
        if not finished:  # the client went away mid-stream: its requests end now
            loop.cancel(job)
