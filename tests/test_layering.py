"""The package's layers, read from the source (every import, at module level or inside a function):

    patch/ (where to put things, per host)  ->  modules/ (what replaces a module)  ->  ops/ (one spec per op)
    tune/ (the tuner and its databases)      ->  ops/ through its registry and spec only
    dispatch (choose, count, the tuned-choice lookup that tune/active.py registers)  <-  ops/, tune/

and no import circle anywhere inside rocm_sd/. Imports under `if TYPE_CHECKING:` are for annotations only and
do not count."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "rocm_sd"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _runtime_nodes(tree: ast.AST):
    """Every node except those inside `if TYPE_CHECKING:` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str) -> set[str]:
    """The rocm_sd modules `name` imports: `from X import Y` counts as X.Y where that is a module, else as X."""
    path = MODULES[name]
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return found


def _violations(importer: str, allowed) -> list[str]:
    return sorted(f"{name} imports {dep}" for name, deps in GRAPH.items() if name.startswith(importer)
                  for dep in deps if not allowed(dep))


def test_the_graph_is_read():
    assert "rocm_sd.ops.spec" in GRAPH["rocm_sd.ops.group_norm"] and "rocm_sd.dispatch" in GRAPH["rocm_sd.ops.spec"]
    assert "rocm_sd.ops" in GRAPH["rocm_sd.tune.problems"]


def test_no_import_circles():
    assert _cycles() == []


def test_ops_import_nothing_of_tune_modules_or_patch():
    assert _violations("rocm_sd.ops", lambda dep: not dep.startswith(("rocm_sd.tune", "rocm_sd.modules",
                                                                      "rocm_sd.patch"))) == []


def test_tune_reaches_the_ops_through_their_registry_and_spec_only():
    assert _violations("rocm_sd.tune", lambda dep: not dep.startswith("rocm_sd.ops")
                       or dep in ("rocm_sd.ops", "rocm_sd.ops.spec")) == []


def test_modules_do_not_import_patch():
    assert _violations("rocm_sd.modules", lambda dep: not dep.startswith("rocm_sd.patch")) == []


def test_a_planted_circle_is_found(monkeypatch):
    monkeypatch.setitem(GRAPH, "rocm_sd.dispatch", GRAPH["rocm_sd.dispatch"] | {"rocm_sd.ops.spec"})
    assert any({"rocm_sd.dispatch", "rocm_sd.ops.spec"} <= set(cycle) for cycle in _cycles())


def test_a_patched_group_norm_silu_call_stays_in_five_files():
    """docs/design.md follows GroupNorm+SiLU from optimize() to the launch; a call of the patched module (planned,
    on the CPU: the PyTorch path) enters only these Python files, so a newcomer reads each of them to follow it."""
    import sys

    import torch
    from torch import nn

    from rocm_sd import config
    from rocm_sd.modules import RocmGroupNorm

    module = RocmGroupNorm.from_group_norm(nn.GroupNorm(4, 8), act="silu")
    x = torch.randn(2, 8, 4, 4)
    entered = set()

    def trace(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(str(PACKAGE)):
            entered.add(Path(frame.f_code.co_filename).relative_to(PACKAGE.parent).as_posix())

    with torch.no_grad(), config.override(log_fallbacks=False):
        module(x)  # plans this shape
        sys.settrace(trace)
        try:
            module(x)
        finally:
            sys.settrace(None)
    assert entered == {"rocm_sd/modules/group_norm.py", "rocm_sd/ops/spec.py", "rocm_sd/ops/group_norm.py",
                       "rocm_sd/dispatch.py", "rocm_sd/ops/_common.py"}
