"""Progress bars for long runs (loading a checkpoint, a simulation), from `rich`: shown only on
an interactive terminal and when logging is not quieter than warnings (`swajax --quiet`), and
removed when done, so captured output and logs never carry them."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator

LOG = logging.getLogger("swajax")


def _visible() -> bool:
    return sys.stderr.isatty() and LOG.getEffectiveLevel() <= logging.WARNING


@contextlib.contextmanager
def progress(total: int, label: str, *, shown: bool = True) -> Iterator[Callable[[int], None]]:
    """`with progress(n, "loading") as advance: ... advance()`; a no-op when not shown."""
    if not (shown and _visible()):
        yield lambda n=1: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n=1: bar.update(task, advance=n)
