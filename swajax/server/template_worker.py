"""A checkpoint's chat template rendered in a process of its own, with a time bound.

A template is code from the checkpoint's author: the sandbox keeps it from touching the machine,
but not from looping (nested loops over the sandbox's largest range run for hours). So the
server never renders one on its event loop or in its own process: a worker process renders,
and one that overruns its bound is killed and replaced, the request refused with the bound
named. Host code; the worker imports only jinja2 (through `swajax.tokenizer`)."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from pathlib import Path

from swajax.errors import InputError

RENDER_SECONDS = 2.0  # hub templates render in milliseconds; this only stops runaway ones
START_SECONDS = 60.0  # a fresh interpreter importing jinja2 and reading the template


def _serve(folder: str | None, source: str | None, conn) -> None:
    """The worker: render each conversation it is sent, answer (ok, text or message)."""
    from swajax.tokenizer import ChatTemplate

    try:
        template = ChatTemplate(Path(folder) if folder else None, source=source)
    except Exception as e:  # noqa: BLE001 - reported to the server, which refuses chat
        conn.send((False, str(e)))
        return
    conn.send((True, "ready"))
    while True:
        messages, variables = conn.recv()
        try:
            conn.send((True, template.render_messages(messages, **variables)))
        except Exception as e:  # noqa: BLE001 - the template's own error goes to the client
            conn.send((False, f"{type(e).__name__}: {e}"))


class TemplateWorker:
    """One rendering process for `folder`'s template; renders one conversation at a time."""

    def __init__(self, folder: Path | None, seconds: float = RENDER_SECONDS, source=None):
        """`source`: a template's text to render instead of the folder's (`--chat-template`),
        with the folder's special tokens."""
        self.folder, self.seconds, self.source = folder, seconds, source
        self._context = multiprocessing.get_context("spawn")  # no fork of a threaded server
        self._lock = threading.Lock()
        self._process = self._conn = None
        self._broken: str | None = None  # the template cannot load: every render says why

    def _start(self) -> None:
        parent, child = self._context.Pipe()
        self._process = self._context.Process(
            target=_serve,
            args=(str(self.folder) if self.folder else None, self.source, child),
            name="swajax-template",
            daemon=True,
        )
        self._process.start()
        child.close()
        self._conn = parent
        if not parent.poll(START_SECONDS):
            self._stop()
            raise RuntimeError(f"the chat template worker did not start in {START_SECONDS:g} s")
        ok, text = parent.recv()
        if not ok:
            self._stop()
            self._broken = text
            raise InputError(text)

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(5)
            self._conn.close()
        self._process = self._conn = None

    def render(self, messages: list[dict], variables: dict | None = None) -> str:
        """The rendered conversation (`variables`: the template's others, such as `tools`);
        InputError if the template fails or overruns."""
        with self._lock:
            if self._broken is not None:
                raise InputError(self._broken)
            if self._process is None or not self._process.is_alive():
                self._start()
            self._conn.send((messages, variables or {}))
            if not self._conn.poll(self.seconds):
                self._stop()
                raise InputError(
                    f"the chat template did not finish rendering within {self.seconds:g} s; "
                    "refused (the template loops too long for this conversation)"
                )
            ok, text = self._conn.recv()
        if not ok:
            raise InputError(f"chat template: {text}")
        return text

    async def render_async(self, messages: list[dict], variables: dict | None = None) -> str:
        return await asyncio.to_thread(self.render, messages, variables)

    def close(self) -> None:
        with self._lock:
            self._stop()
