"""`swajax serve`: the OpenAI-compatible server (FastAPI + uvicorn, the `serve` extra)."""

from __future__ import annotations

from pathlib import Path

from swajax.cli import args as args_lib

SERVE_EXTRA = "install the 'serve' extra: pip install 'swajax[serve]'"


def run_serve(args) -> int:
    try:
        import uvicorn

        from swajax.server.app import make_app
    except ImportError as e:
        raise args_lib.UsageError(f"swajax serve needs {e.name}: {SERVE_EXTRA}") from None
    from swajax.api import LLM
    from swajax.cli.generate import engine_fields

    fields = engine_fields(args)
    del fields["dtype"], fields["num_speculative_tokens"]
    llm = LLM(args.model, dtype=args.dtype, dequantize_weights=args.dequantize_weights, **fields)
    folder = None if args.model == "tiny" else Path(args.model)
    name = args.served_model_name or ("tiny" if folder is None else folder.name)
    app = make_app(llm, model_name=name, folder=folder, max_waiting=args.max_waiting)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def register(sub) -> None:
    from swajax.cli.generate import add_decode_steps, add_model_args

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server on the engine")
    add_model_args(p, prompts=False)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=args_lib.int_at_least(0, 65535), default=8000,
                   help="port to listen on (0: any free one)")  # fmt: skip
    p.add_argument("--served-model-name", help="the model's name in the API (default: folder)")
    p.add_argument("--max-waiting", type=args_lib.int_at_least(1), default=256,
                   help="queued requests before new ones get 429")  # fmt: skip
    p.add_argument("--no-overlap", action="store_true",
                   help="read each step's result before planning the next")  # fmt: skip
    add_decode_steps(p)  # streams then come up to N tokens at a time; 1 for each as made
    p.set_defaults(func=run_serve)
