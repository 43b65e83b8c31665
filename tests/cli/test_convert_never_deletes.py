"""`swajax convert` deletes nothing it did not write: an output that is, holds or lies inside the
source is refused; `--force` replaces only an earlier convert output or an empty folder; a
failed write names the output, not a temporary folder. After every refusal the source and its
neighbours are checked byte for byte."""

import shutil

import pytest
from helpers import FIXTURES

from swajax.cli.main import main


def snapshot(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def parent(tmp_path):
    """parent/src (a checkpoint) beside parent/notes.txt (someone's file)."""
    shutil.copytree(FIXTURES / "mistral", tmp_path / "parent" / "src")
    (tmp_path / "parent" / "notes.txt").write_text("keep me")
    return tmp_path / "parent"


@pytest.mark.parametrize("to", [[], ["--to", "hf"]])
@pytest.mark.parametrize(
    "out, needle",
    [
        ("src", "is the source folder itself"),
        (".", "holds the source"),
        ("src/converted", "lies inside the source"),
        ("other", "was not written by this command"),
    ],
)
def test_an_output_over_what_it_reads_or_someone_elses_is_refused(parent, capsys, to, out, needle):
    (parent / "other").mkdir()
    (parent / "other" / "data.bin").write_bytes(b"\x00\x01")
    before = snapshot(parent)
    src, dst = parent / "src", parent / out
    source = str(src) if not to else str(parent / "orbax")
    if to:  # --to hf reads an orbax folder: make one first, beside the rest
        assert main(["convert", str(src), source]) == 0
        before = snapshot(parent)
        dst = parent / out.replace("src", "orbax")
    assert main(["convert", source, str(dst), "--force", *to]) == 2
    err = capsys.readouterr().err
    assert needle in err and str(dst.absolute()) in err and ".tmp-" not in err
    assert snapshot(parent) == before


def test_force_replaces_an_earlier_output_or_an_empty_folder(parent):
    out = parent / "out"
    out.mkdir()
    assert main(["convert", str(parent / "src"), str(out), "--force"]) == 0  # empty: fine
    assert main(["convert", str(parent / "src"), str(out), "--force"]) == 0  # its own output
    assert main(["convert", str(out), str(parent / "hf"), "--to", "hf"]) == 0
    assert main(["convert", str(out), str(parent / "hf"), "--to", "hf", "--force"]) == 0
    assert (parent / "notes.txt").read_text() == "keep me"


def test_a_failed_write_names_the_output(parent, capsys, monkeypatch):
    from swajax.models import loading

    def failing():
        raise PermissionError(13, "Permission denied", str(parent / ".out.tmp-x1y2" / "params"))

    monkeypatch.setattr(loading, "_checkpointer", failing)
    assert main(["convert", str(parent / "src"), str(parent / "out")]) == 2
    err = capsys.readouterr().err
    assert f"writing {parent / 'out'} failed: Permission denied (params)" in err
    assert ".tmp-" not in err and sorted(p.name for p in parent.iterdir()) == ["notes.txt", "src"]
