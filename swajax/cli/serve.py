"""`swajax serve`: the OpenAI-compatible server (FastAPI + uvicorn, the `serve` extra).

On SIGTERM / SIGINT the requests in flight are aborted first (each client gets its answer, with
the reason), then the HTTP server closes: a stop never waits for generations to run out. With
`--state-dir` the engine, then at rest, saves its prefix cache there, and the next start from
the same folder restores it (`swajax.api.state`): a restarted server serves warm."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
from pathlib import Path

from swajax.cli import args as args_lib

SERVE_EXTRA = "install the 'serve' extra: pip install 'swajax[serve]'"


def run_serve(args) -> int:
    try:
        import uvicorn

        from swajax.server.app import make_app
    except ImportError as e:
        raise args_lib.UsageError(f"swajax serve needs {e.name}: {SERVE_EXTRA}") from None
    from swajax.api import LLM, EngineSpec
    from swajax.cli.generate import engine_fields, speculative

    llm = LLM.from_spec(
        args.model,
        EngineSpec.of(**engine_fields(args), warmup=not args.no_warmup),
        revision=args.revision,
        generation_config=args.generation_config,
        draft_model=speculative(args)[0],
        dequantize_weights=args.dequantize_weights,
        flags=("--model", "--draft-model"),
    )
    if llm.warmed_up is not None:
        ready, compiled, seconds = llm.warmed_up
        print(
            f"swajax serve: warm-up: {ready} step programs ready ({compiled} compiled, "
            f"{ready - compiled} from the program store) in {seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    if args.state_dir is not None:
        _restore(llm, Path(args.state_dir))
    folder = None if args.model == "tiny" else llm.folder
    name, *aliases = args.served_model_name or [served_name(args.model)]
    api_key = args.api_key or os.environ.get("SWAJAX_API_KEY") or None
    app = make_app(
        llm,
        model_name=name,
        folder=folder,
        max_waiting=args.max_waiting,
        api_key=api_key,
        max_body_mib=args.max_body_mib,
        aliases=tuple(aliases),
        metrics_prefix=f"{args.metrics_prefix}:",
        chat_template=chat_template(args.chat_template),
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=GRACE_SECONDS,
    )
    server = _server_class(uvicorn)(config, app.state.loop.abort_all, name, api_key is not None)
    loop = app.state.loop
    server.at_rest = (lambda: _save(llm, Path(args.state_dir), loop)) if args.state_dir else None
    server.run()
    return 0 if server.saved else 1


def chat_template(given: str | None) -> str | None:
    """`--chat-template`: a file's text, or the text given if it is a template; else a
    UsageError naming it (a name SGLang knows, such as `chatml`, is not a file here)."""
    if given is None:
        return None
    path = Path(given).expanduser()
    if path.is_file():
        return path.read_text()
    if "{{" in given or "{%" in given:
        return given
    raise args_lib.UsageError(
        f"--chat-template {given!r} is neither a file nor a template's text (a named template "
        "of SGLang's is not known here: give its file)"
    )


def _restore(llm, folder: Path) -> None:
    """Restore a snapshot if `folder` holds one (a first start finds none)."""
    from swajax.api.state import HEADER, restore_state

    if not (folder / HEADER).is_file():
        print(f"swajax serve: no saved state in {folder} yet: starting cold", file=sys.stderr)
        return
    got = restore_state(llm.engine, folder, requests=False)
    dropped = f"; {got['dropped_requests']} unfinished requests dropped" * bool(
        got["dropped_requests"]
    )
    print(
        f"swajax serve: restored the prefix cache from {folder} ({got['tokens']} tokens in "
        f"{got['nodes']} nodes{dropped})",
        file=sys.stderr,
        flush=True,
    )


def _save(llm, folder: Path, loop) -> bool:
    """Save the engine (its loop has stopped); a state that cannot be saved is one line, not
    a traceback, and `serve` then exits with status 1 (the save was asked for)."""
    from swajax.api.state import save_state
    from swajax.errors import InputError

    if loop.alive:
        return _not_saved(
            f"the engine's step in progress had not ended; {folder} keeps the previous one"
        )
    try:
        save_state(llm.engine, folder, force=True)
    except InputError as e:
        return _not_saved(str(e))
    except Exception as e:  # noqa: BLE001 - a full disk in orbax, ...: one line, not a traceback
        return _not_saved(f"{type(e).__name__}: {e}; {folder} keeps the previous snapshot")
    print(f"swajax serve: saved the prefix cache to {folder}", file=sys.stderr, flush=True)
    return True


def _not_saved(why: str) -> bool:
    print(f"swajax serve: the state was not saved: {why}", file=sys.stderr, flush=True)
    return False


def served_name(model: str) -> str:
    """The model's name in the API: the hub id or "tiny" as given; for a folder, the hub id of
    a Hugging Face cache snapshot (`models--ORG--NAME/snapshots/REV`), else its own name."""
    path = Path(model)
    if model == "tiny" or not path.is_dir():
        return model
    parts = path.resolve().parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].removeprefix("models--").replace("--", "/")
    return path.name


GRACE_SECONDS = 10  # after the aborts, how long a connection may take to read its answer
# After a stop signal: how long new requests are still answered (503, Retry-After) while the
# answers of those in flight go out, before the listening socket closes.
DRAIN_SECONDS = 1.0


def _server_class(uvicorn):
    class Server(uvicorn.Server):
        """uvicorn's server, which aborts the engine's work on a stop signal and says when it
        is ready (address, model, whether a key is required)."""

        def __init__(self, config, abort_all, model: str, keyed: bool):
            super().__init__(config)
            self.abort_all, self.model, self.keyed = abort_all, model, keyed

        at_rest = None  # called once the engine loop has stopped (`--state-dir`'s save)
        draining = False  # a stop signal came: answering 503 until uvicorn stops
        saved = True  # False: `--state-dir`'s save failed (the exit status says so)
        event_loop = None

        def handle_exit(self, sig, frame) -> None:
            """The first stop signal answers every client in flight at once (`abort_all`)
            and keeps listening for DRAIN_SECONDS, answering each new request 503 with
            Retry-After, before uvicorn stops; a second one stops at once."""
            if self.draining or self.should_exit:
                return super().handle_exit(sig, frame)
            self.draining = True
            self.abort_all()
            loop = self.event_loop
            if loop is None:
                return super().handle_exit(sig, frame)
            stop = functools.partial(super().handle_exit, sig, frame)
            loop.call_soon_threadsafe(loop.call_later, DRAIN_SECONDS, stop)

        async def shutdown(self, sockets=None) -> None:
            await super().shutdown(sockets)  # the app's lifespan stops the engine loop
            if self.at_rest is not None:  # before uvicorn re-raises the stop signal
                self.saved = self.at_rest()

        async def startup(self, sockets=None) -> None:
            self.event_loop = asyncio.get_running_loop()
            await super().startup(sockets)
            if self.should_exit or not self.servers:
                return
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            key = "an API key required" if self.keyed else "no API key"
            print(
                f"swajax serve: ready on http://{host}:{port} (model {self.model}; {key})",
                file=sys.stderr,
                flush=True,
            )

    return Server


def register(sub) -> None:
    from swajax.cli.generate import add_decode_steps, add_model_args, add_speculative

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server on the engine")
    add_model_args(p, prompts=False)
    p.add_argument(
        "--generation-config",
        choices=("auto", "vllm"),
        default="auto",
        help="auto: sampling defaults from the checkpoint's generation_config.json for fields a "
        "request leaves unset; vllm: ignore it",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument(
        "--port",
        type=args_lib.int_at_least(0, 65535),
        default=8000,
        help="port to listen on (0: any free one)",
    )
    p.add_argument(
        "--served-model-name",
        nargs="+",
        help="the model's name in the API (default: the hub id or the folder's name); more "
        "names: requests may give any of them",
    )
    p.add_argument(
        "model_tag",
        nargs="?",
        metavar="MODEL",
        help="the model, as `vllm serve MODEL` takes it (the same as --model)",
    )
    p.add_argument(
        "--seed",
        "--random-seed",
        type=args_lib.SEED,
        default=0,
        help="the seed of requests that give none (vLLM's and SGLang's engine seed)",
    )
    p.add_argument(
        "--metrics-prefix",
        choices=("swajax", "vllm"),
        default="swajax",
        help="the prefix of /metrics' names; vllm: vLLM's own names, for dashboards and "
        "alerts written for vLLM",
    )
    p.add_argument(
        "--chat-template",
        help="the chat template to render instead of the checkpoint's: a file, or the "
        "template's text (as vLLM and SGLang take it)",
    )
    p.set_defaults(uvicorn_log_level="warning")
    p.add_argument(
        "--max-waiting",
        type=args_lib.int_at_least(1),
        default=256,
        help="queued sequences (a request counts prompts x n) before new ones get 429",
    )
    p.add_argument(
        "--api-key",
        help="require a bearer key on /v1/* (default: $SWAJAX_API_KEY; none: open)",
    )
    p.add_argument(
        "--max-body-mib",
        type=args_lib.float_in(0.001, 1024),
        default=8.0,
        help="largest request body read, in MiB (larger: 413 before it is parsed)",
    )
    p.add_argument(
        "--no-overlap", action="store_true", help="read each step's result before planning the next"
    )
    add_decode_steps(p)  # streams then come up to N tokens at a time; 1 for each as made
    add_speculative(p)
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the warm-up: by default every program a step can need is compiled (or "
        "loaded from the program store) before the server says it is ready, with step shapes "
        "fixed so that the set is small, and none compiles while it serves; without it, "
        "shapes follow each batch and a new one compiles when first met",
    )
    p.add_argument(
        "--state-dir",
        help="keep the prefix cache across restarts: restore it from this folder at start (if "
        "a stop saved one there) and save it there at a stop (only a folder swajax wrote is "
        "replaced)",
    )
    p.set_defaults(func=run_serve)
