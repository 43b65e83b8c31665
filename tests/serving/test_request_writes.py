"""A `Request`'s fields are written by its own methods and by the scheduler, nowhere else in
`serving/`: everything else calls one of those."""

import ast
import dataclasses
import pathlib

from swajax.serving.request import Request

SERVING = pathlib.Path(__file__).resolve().parents[2] / "swajax" / "serving"


def _writes(path: pathlib.Path, fields: set[str]) -> list[str]:
    writes = []
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
    return writes


def test_requests_are_changed_in_two_places_only():
    fields = {f.name for f in dataclasses.fields(Request)}
    writes = [
        w
        for path in sorted(SERVING.glob("*.py"))
        if path.name not in ("request.py", "scheduler.py")
        for w in _writes(path, fields)
    ]
    assert not writes, writes


def test_the_check_sees_a_write(tmp_path):
    """The walk is not blind: a helper that sets a request's field is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f(req):\n    req.status = None\n    req.output.append(1)\n")
    assert _writes(bad, {"status", "output"}) == ["bad.py:2 req.status", "bad.py:3 req.output"]
