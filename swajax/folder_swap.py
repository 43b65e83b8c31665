"""Writing a folder in one step: build it beside the destination, then swap it into place.

`swap_in(out, build)` builds into a temporary folder `.OUT.tmp-XXXX` next to `out` and then puts
it in place. Where the filesystem can exchange two names atomically (Linux `renameat2` with
`RENAME_EXCHANGE`), `out` is at every instant the old folder or the new one. Elsewhere the old
folder is renamed aside to `.OUT.old` first; a run killed between the two renames leaves `out`
missing for that moment, and the next `swap_in` (or `recover`) of the same `out` puts the old
folder back. Either way the next run deletes the temporaries a killed run left. One writer per
`out` at a time.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import glob
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from swajax.errors import InputError

# The stamp of a `swajax convert` output: `--force` replaces only a folder that carries it.
CONVERT_MARKER = ".swajax-convert"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


class FolderError(InputError):
    """The destination cannot be written (it names the folder and why)."""


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _old(out: Path) -> Path:
    return out.with_name(f".{out.name}.old")


def _tmp_prefix(out: Path) -> str:
    return f".{out.name}.tmp-"


def recover(out: str | Path) -> None:
    """Finish or undo a swap that a killed run left half done, and delete its temporaries."""
    out = Path(out).absolute()
    old = _old(out)
    if old.exists() or old.is_symlink():
        if out.exists():
            _remove(old)  # the new folder was in place: only the deletion was left
        else:
            os.rename(old, out)  # killed between the renames: the old folder comes back
    for tmp in out.parent.glob(glob.escape(_tmp_prefix(out)) + "*"):
        _remove(tmp)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing names atomically; False where the system cannot."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def swap_in(
    out: str | Path,
    build: Callable[[Path], None],
    *,
    force: bool = False,
    source: str | Path | None = None,
    marker: str | None = None,
) -> None:
    """Build a new `out` with `build(folder)` and put it in place; if `build` raises, `out` is
    as it was. A non-empty `out` is refused unless `force`.

    `source`: the folder `build` reads; an `out` that is it, holds it or lies inside it is
    refused (replacing `out` would delete what is being read). `marker`: a file name `build`'s
    output is stamped with; `force` then replaces only an `out` that carries it (an earlier
    output of the same writer) or is empty, never a folder someone else wrote."""
    out = Path(out).absolute()
    if source is not None:
        _check_apart(Path(source), out)
    if not out.parent.is_dir():
        raise FolderError(f"folder {out.parent} does not exist")
    with _turn(out):
        _swap_in(out, build, force=force, marker=marker)


@contextlib.contextmanager
def _turn(out: Path):
    """One writer of `out` at a time, across processes: an exclusive lock on its parent folder
    (no file of ours is left there); a second writer waits for the first to finish."""
    fd = os.open(out.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _swap_in(out: Path, build, *, force: bool, marker: str | None) -> None:
    recover(out)
    occupied = out.exists() and (not out.is_dir() or any(out.iterdir()))
    if occupied and not force:
        raise FolderError(f"{out} exists and is not empty (use --force to replace it)")
    if occupied and marker is not None and not (out / marker).is_file():
        raise FolderError(
            f"{out} is not empty and was not written by this command (no {marker} in it); "
            "--force replaces only an earlier output or an empty folder: choose another OUT"
        )
    try:
        tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(out), dir=out.parent))
    except OSError as e:  # the user's folder, not the temporary name that was refused
        raise FolderError(f"cannot write {out}: {e.strerror or e} in {out.parent}") from e
    try:
        try:
            build(tmp)
            if marker is not None:
                (tmp / marker).write_text(f"written by swajax for {out.name}\n")
        except OSError as e:  # name the destination, not the temporary folder
            where = Path(e.filename).name if e.filename else ""
            detail = f"{e.strerror or e}" + (f" ({where})" if where else "")
            raise FolderError(f"writing {out} failed: {detail}") from e
        if out.exists() and _exchange(tmp, out):
            _remove(tmp)  # now the old folder
            return
        if out.exists() or out.is_symlink():
            os.rename(out, _old(out))
        os.rename(tmp, out)
        _remove(_old(out))
    finally:
        if tmp.exists():
            _remove(tmp)


def _check_apart(source: Path, out: Path) -> None:
    """Refuse an output that is the source, holds it, or lies inside it."""
    src, dst = source.resolve(), out.resolve()
    if dst == src:
        raise FolderError(f"the output {out} is the source folder itself: choose another OUT")
    if src.is_relative_to(dst):
        raise FolderError(
            f"the output {out} holds the source {source}: replacing it would delete the "
            "source; choose another OUT"
        )
    if dst.is_relative_to(src):
        raise FolderError(f"the output {out} lies inside the source {source}: choose another OUT")
