"""`swap_in` under SIGKILL: a process killed at each phase of writing a folder leaves the
destination as the old folder or the new one (the next run restores the old one where the
system could not exchange names atomically), and the next run leaves no temporary behind."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from swajax.folder_swap import FolderError, recover, swap_in

# Runs in a child: kill itself at the named phase of swap_in.
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from swajax import folder_swap

    out, phase, atomic = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)

    def build(folder):
        (folder / "a.txt").write_text("new")
        if phase == "build":
            die()
        (folder / "b.txt").write_text("new")

    exchange, rename, remove = folder_swap._exchange, os.rename, folder_swap._remove
    def exchange_then(a, b):
        if not atomic:
            return False
        done = exchange(a, b)
        if phase == "after_swap":
            die()
        return done
    def rename_then(a, b):
        rename(a, b)
        if phase == "after_aside" and Path(b).name.endswith(".old"):
            die()
        if phase == "after_swap" and Path(b) == out:
            die()
    folder_swap._exchange = exchange_then
    folder_swap.os.rename = rename_then
    folder_swap.swap_in(out, build, force=True)
    """
)


def _state(out) -> str:
    if not out.exists():
        return "missing"
    names = sorted(p.name for p in out.iterdir())
    texts = {(out / n).read_text() for n in names}
    if names == ["a.txt"] and texts == {"old"}:
        return "old"
    if names == ["a.txt", "b.txt"] and texts == {"new"}:
        return "new"
    return f"mixed {names} {texts}"


@pytest.mark.parametrize("atomic", [True, False])
@pytest.mark.parametrize("phase", ["build", "after_aside", "after_swap", "none"])
def test_a_kill_at_any_phase_leaves_old_or_new(tmp_path, phase, atomic):
    if atomic and phase == "after_aside":
        pytest.skip("an atomic exchange has no aside phase")
    out = tmp_path / "OUT"
    out.mkdir()
    (out / "a.txt").write_text("old")
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(out), phase, str(int(atomic))],
        capture_output=True,
        text=True,
    )
    if phase == "none":
        assert child.returncode == 0, child.stderr
    else:
        assert child.returncode == -signal.SIGKILL, child.stderr
    before = _state(out)
    allowed = {"old", "new"} | ({"missing"} if phase == "after_aside" else set())
    assert before in allowed
    recover(out)  # what the next run does first
    after = _state(out)
    expected = {"build": "old", "after_aside": "old", "after_swap": "new", "none": "new"}[phase]
    assert after == expected
    assert sorted(os.listdir(tmp_path)) == ["OUT"], "a temporary was left behind"


def test_a_failed_build_leaves_the_folder_as_it_was(tmp_path):
    out = tmp_path / "OUT"
    out.mkdir()
    (out / "a.txt").write_text("old")

    def build(folder):
        (folder / "a.txt").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        swap_in(out, build, force=True)
    assert _state(out) == "old" and sorted(os.listdir(tmp_path)) == ["OUT"]


def test_a_non_empty_folder_needs_force(tmp_path):
    (tmp_path / "OUT").mkdir()
    (tmp_path / "OUT" / "x").write_text("x")
    with pytest.raises(FolderError, match="not empty"):
        swap_in(tmp_path / "OUT", lambda f: None)
    with pytest.raises(FolderError, match="does not exist"):
        swap_in(tmp_path / "no" / "OUT", lambda f: None)
