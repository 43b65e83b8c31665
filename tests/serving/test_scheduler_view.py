"""The scheduler's helpers reach it only through `SchedulerView`, and the scheduler offers all
of it."""

import ast
import pathlib

from swajax import sizing
from swajax.api import engine_for
from swajax.presets import load_preset
from swajax.serving.null_model import NullModel
from swajax.serving.scheduler_view import SchedulerView

HELPERS = ("results", "progress", "overlap", "speculation", "tail_rebuild")
SERVING = pathlib.Path(__file__).resolve().parents[2] / "swajax" / "serving"


def _declared() -> set[str]:
    names = set(getattr(SchedulerView, "__annotations__", {}))
    names |= {n for n, v in vars(SchedulerView).items() if callable(v) and not n.startswith("_")}
    return names


def test_helpers_use_only_the_view():
    used = {}
    for name in HELPERS:
        for node in ast.walk(ast.parse((SERVING / f"{name}.py").read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "sched":
                    used.setdefault(node.attr, set()).add(name)
    undeclared = {attr: files for attr, files in used.items() if attr not in _declared()}
    assert used and not undeclared, undeclared


def test_the_scheduler_offers_the_whole_view():
    cfg = load_preset("tiny-hybrid")
    sizes = sizing.size_hybrid(cfg, 1 << 20, ratio=0.5, page_size=4, dtype="bf16")
    scheduler = engine_for(cfg, NullModel(), sizes).scheduler
    missing = [n for n in sorted(_declared()) if not hasattr(scheduler, n)]
    assert not missing


def test_requests_are_changed_in_two_places_only():
    """A `Request`'s fields are written by its own methods and by the scheduler's lifecycle
    (admit, start, retract, finish, abort); everything else calls one of those."""
    import dataclasses

    from swajax.serving.request import Request

    fields = {f.name for f in dataclasses.fields(Request)}
    writes = []
    for path in sorted(SERVING.glob("*.py")):
        if path.name in ("request.py", "scheduler.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign):
                targets = [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("append", "extend", "pop", "clear"):
                    targets = [node.func.value]
            for t in targets:
                for sub in ast.walk(t):
                    if (
                        isinstance(sub, ast.Attribute)
                        and sub.attr in fields
                        and isinstance(sub.value, ast.Name)
                        and sub.value.id in ("req", "r", "request")
                    ):
                        writes.append(f"{path.name}:{sub.lineno} {sub.value.id}.{sub.attr}")
    assert not writes, writes
