"""Reading JSON-lines inputs (prompts, workloads, traces) a line at a time, with errors that name
the file and the line.

A line longer than `MAX_LINE_BYTES` is refused as soon as that many bytes are read, so a
1 GiB line costs 64 MiB and a fraction of a second, not a MemoryError after minutes; only
regular files are read (`/dev/zero`, a FIFO or a folder are refused before any read).
"""

from __future__ import annotations

import gzip
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from swajax.errors import InputError

MAX_LINE_BYTES = 64 << 20  # a 16M-token prompt_ids line fits; a runaway file does not


def open_regular(path: str | Path, what: str) -> BinaryIO:
    """`path` opened for reading in binary; a ValueError names it unless it is a regular file."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    except OSError as e:
        raise InputError(f"cannot read the {what} {path}: {e.strerror or e}") from e
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise InputError(f"the {what} {path} is not a regular file")
    return f


def lines(
    path: str | Path, what: str, *, gzipped: bool | None = False
) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line of a regular file, each at most `MAX_LINE_BYTES`.
    `gzipped=None`: decompress when the file starts with gzip's magic bytes."""
    with open_regular(path, what) as raw:
        stream: BinaryIO = raw
        if gzipped is None:
            gzipped = raw.peek(2)[:2] == b"\x1f\x8b" if hasattr(raw, "peek") else False
        if gzipped:
            stream = gzip.GzipFile(fileobj=raw)  # type: ignore[assignment]
        number = 0
        while True:
            try:
                line = stream.readline(MAX_LINE_BYTES + 1)
            except (OSError, EOFError) as e:  # a damaged or cut gzip stream
                raise InputError(f"cannot read the {what} {path}: {e} (truncated?)") from e
            if not line:
                return
            number += 1
            if len(line) > MAX_LINE_BYTES:
                raise InputError(
                    f"{path}:{number}: the line is longer than {MAX_LINE_BYTES} "
                    f"bytes (the limit for one line of a {what})"
                )
            try:
                yield number, line.decode()
            except UnicodeDecodeError as e:
                raise InputError(f"{path}:{number}: not UTF-8 text ({e.reason})") from e


def parse(text: str, where: str):
    """One JSON value; a ValueError names `where` (file:line)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: not JSON ({e.msg})") from e
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply to read") from None


def read_json_lines(path: str | Path, what: str) -> list[tuple[str, object]]:
    """(`path:line`, parsed value) of every non-blank line; a ValueError names the file (`what`
    it is) or the line."""
    return [
        (f"{path}:{n}", parse(text, f"{path}:{n}")) for n, text in lines(path, what) if text.strip()
    ]
