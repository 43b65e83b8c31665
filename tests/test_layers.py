"""Folders are layers and imports point down: every `import` in the package (lazy ones inside
functions included) goes to its own folder or to a layer below, in the order README.md prints,
and no two modules import each other, directly or around a loop."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Top to bottom. `base` is the package's top-level modules (sizing, presets, helpers) and
# config/.
LAYERS = (
    "cli",
    "server",
    "conformance",
    "trace",
    "simulator",
    "api",
    "demo",
    "runner",
    "serving",
    "prefix_cache",
    "models",
    "attention",
    "kernels",
    "memory",
    "base",
)
PACKAGE_FACADE = "swajax"  # swajax/__init__.py: the public names
BASE_FOLDERS = ("config",)  # folders of the base layer


def _modules() -> dict[str, pathlib.Path]:
    """Dotted name -> file, for swajax/ and the repository's kernels/ (installed as
    swajax.kernels)."""
    out = {}
    for base, prefix in ((ROOT / "swajax", "swajax"), (ROOT / "kernels", "swajax.kernels")):
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([prefix, *parts])] = path
    return out


def _imports(name: str, path: pathlib.Path, modules) -> set[str]:
    """The swajax modules `name` imports (a `from pkg import sub` names the submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if module == PACKAGE_FACADE:
        return PACKAGE_FACADE
    if parts[1] == "__main__":
        return "cli"
    if parts[1] in LAYERS:
        return parts[1]
    if parts[1] in BASE_FOLDERS:
        return "base"
    assert len(parts) == 2, f"{module}: a folder that is not a layer; add it to LAYERS and README"
    return "base"


def _graph():
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_readme_prints_the_layers_in_this_order():
    readme = (ROOT / "README.md").read_text()
    assert " -> ".join(LAYERS) in readme


def test_imports_point_down():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = []
    for module, targets in _graph().items():
        here = layer_of(module)
        if here == PACKAGE_FACADE:
            continue
        for target in targets:
            there = layer_of(target)
            if there == PACKAGE_FACADE or rank[there] < rank[here]:
                upward.append(f"{module} ({here}) imports {target} ({there})")
    assert not upward, "imports that point up:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    graph = _graph()
    # A package's __init__ re-exporting its own submodules is not a cycle of concepts.
    graph = {
        m: {t for t in ts if not (m.startswith(t + ".") and layer_of(t) == layer_of(m))}
        for m, ts in graph.items()
    }
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []
    cycles = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join([*stack[stack.index(t) :], t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The walker itself: a lazy import inside a function, pointing up, is found."""
    fake = tmp_path / "swajax" / "memory"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("def f():\n    from swajax.serving import engine\n")
    modules = {"swajax.memory.bad": fake / "bad.py", "swajax.serving.engine": fake / "bad.py"}
    assert _imports("swajax.memory.bad", fake / "bad.py", modules) == {"swajax.serving.engine"}
