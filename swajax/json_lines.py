"""Reading a JSON-lines input file (prompts, workloads) with errors that name the line."""

from __future__ import annotations

import json
from pathlib import Path


def read_json_lines(path: str | Path, what: str) -> list[tuple[str, object]]:
    """(`path:line`, parsed value) of every non-blank line; a ValueError names the file (`what`
    it is) or the line that is not JSON."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the {what} {path}: {e}") from e
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            out.append((where, json.loads(line)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg})") from e
    return out
