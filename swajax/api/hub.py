"""Where a model argument points: the embedded demo, a checkpoint folder, or a hub id found in
the local Hugging Face cache (its `huggingface_hub` layout: `models--ORG--NAME/snapshots/REV`).

Nothing is downloaded at run time: an id is looked up in the cache only (so `HF_HUB_OFFLINE` is
always honoured), and an id that is not there is an error naming it and the command that
fetches it."""

from __future__ import annotations

import re
from pathlib import Path

from swajax.demo import DEMO_DIR
from swajax.errors import InputError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model(model: str, revision: str | None = None, flag: str = "model") -> Path:
    """The folder `model` names: DEMO_DIR for "tiny", the folder itself, or the cached snapshot
    of hub id `model` at `revision` (a branch, tag or commit; default "main")."""
    if not isinstance(model, str) or not model:
        raise InputError(f"{flag} must be 'tiny', a checkpoint folder or a hub id, got {model!r}")
    if model == "tiny":
        if revision is not None:
            raise InputError(f"revision {revision!r} applies to a hub id, not to 'tiny'")
        return DEMO_DIR
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists() or not HUB_ID.match(model):
        raise InputError(
            f"{flag} must be 'tiny', a checkpoint folder or a hub id (ORG/NAME), got {model!r}"
        )
    return _cached(model, revision, flag)


def _cached(repo: str, revision: str | None, flag: str) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(repo, revision=revision, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        at = f" at revision {revision!r}" if revision else ""
        raise InputError(
            f"{flag} {repo!r}{at} is not a folder and is not in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); swajax downloads nothing: fetch it first, e.g. "
            f"`{download_command()} download {repo}`{' --revision ' + revision if revision else ''}"
        ) from None
    return Path(folder)


def download_command() -> str:
    """The command the installed huggingface_hub ships: `hf` (0.34 and later; 2.x has no
    other), else the older `huggingface-cli`."""
    import importlib.metadata

    scripts = importlib.metadata.entry_points(group="console_scripts")
    names = {e.name for e in scripts if e.value.startswith("huggingface_hub")}
    return "hf" if "hf" in names or not names else "huggingface-cli"
