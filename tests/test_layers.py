"""naiad's layering, read from the source: front ends reach the core only through the service face, and no
naiad module imports, even indirectly, one that imports it.

Every import counts, at module level or inside a function (a lazy import is still a dependency, only a later
one), with one exception: imports under ``if TYPE_CHECKING:``, which never run and exist only so an
annotation can name a class (``frontends/sagemaker/runtime.py`` names the router that owns it that way).
"""

from __future__ import annotations

import ast
from pathlib import Path

import naiad

ROOT = Path(naiad.__file__).parent
FRONT_ENDS = ("naiad.frontends", "naiad.ray")
# SageMaker's platform side (naiad/sagemaker/) straddles the face: its model management (the residency and the
# url rules it loads by) is below it; its contract, options, counters and serve script are plain values over the
# core that both sides share.
SAGEMAKER_BELOW = ("naiad.sagemaker.residency", "naiad.sagemaker.urls")
BELOW_THE_FACE = ("naiad.repository", "naiad.scheduling", "naiad.backends", *SAGEMAKER_BELOW)
ABOVE_THE_FACE = ("naiad.service", "naiad.frontends", "naiad.ray", "naiad.server", "naiad.cli")


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The naiad module an imported name lives in (``naiad.core.errors.invalid`` -> ``naiad.core.errors``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path) -> dict[str, int]:
    """The naiad modules ``module`` imports, each with the line of its first import."""
    found: dict[str, int] = {}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # ``from a.b import c``: c may be a module of its own, else a name in a.b.
            names = [f"{base}.{alias.name}" for alias in node.names] or [base]
        for name in names:
            if name.split(".")[0] != "naiad":
                continue
            target = _resolve(name)
            if target is not None and target != module:
                found.setdefault(target, node.lineno)  # type: ignore[attr-defined]
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def test_the_graph_is_read() -> None:
    # The reader finds what it must, or the tests below would pass on an empty graph.
    assert "naiad.service.face" in GRAPH["naiad.service"]
    assert "naiad.frontends.replies" in GRAPH["naiad.frontends.http.routes"]
    assert "naiad.service" in GRAPH["naiad.frontends.grpc.inference"]
    assert "naiad.repository.manager" in GRAPH["naiad.service.face"]
    assert "naiad.sagemaker.serve" in GRAPH["naiad.cli"]  # a function-level import
    assert "naiad.sagemaker.contract" in GRAPH["naiad.frontends.sagemaker.replies"]
    assert "naiad.repository.model_cache" in GRAPH["naiad.sagemaker.residency"]
    assert "naiad.frontends.sagemaker.routes" not in GRAPH["naiad.frontends.sagemaker.runtime"]  # TYPE_CHECKING
    assert len(GRAPH) > 100


def test_front_ends_use_only_the_service_face() -> None:
    reaching = [f"{MODULES[module].relative_to(ROOT.parent)}:{line} imports {target}"
                for module, targets in sorted(GRAPH.items()) if module.startswith(FRONT_ENDS)
                for target, line in sorted(targets.items()) if target.startswith(BELOW_THE_FACE)]
    assert reaching == []


def test_sagemaker_shared_side_stays_beside_the_core() -> None:
    # What front ends may import from naiad/sagemaker/ must not itself lead below the face or above it.
    shared = [m for m in GRAPH if m.startswith("naiad.sagemaker") and not m.startswith(SAGEMAKER_BELOW)]
    assert {"naiad.sagemaker.contract", "naiad.sagemaker.counters", "naiad.sagemaker.serve"} <= set(shared)
    reaching = [f"{module} imports {target}" for module in sorted(shared) for target in sorted(GRAPH[module])
                if target.startswith(BELOW_THE_FACE + ABOVE_THE_FACE)]
    assert reaching == []


def test_the_model_cache_edits_the_repository_only_through_its_api() -> None:
    # register / unregister keep the repository's tables consistent; a cache that deletes entries itself does not.
    edits = []
    for module, path in sorted(MODULES.items()):
        if not (module == "naiad.repository.model_cache" or module.startswith("naiad.sagemaker")):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            table = None
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
                table = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "pop", "clear", "update", "setdefault", "popitem"):
                table = node.func.value
            if (isinstance(table, ast.Attribute) and table.attr in ("models", "registered", "loading")
                    and isinstance(table.value, ast.Attribute) and table.value.attr == "repository"):
                edits.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert edits == []


# What the service holds below its face: a front end that reads ``service.repository`` reaches past it without
# importing anything.
HELD_BELOW = {"repository", "residency", "control"}


def test_front_ends_do_not_reach_through_the_service() -> None:
    reaching = []
    for module, path in sorted(MODULES.items()):
        if not module.startswith(FRONT_ENDS):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in HELD_BELOW:
                held_by = node.value
                name = held_by.attr if isinstance(held_by, ast.Attribute) else getattr(held_by, "id", "")
                if name == "service":
                    reaching.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} service.{node.attr}")
    assert reaching == []


def _cycles() -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                connect(w)
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
                components.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            connect(module)
    return components


def test_no_import_cycles() -> None:
    assert _cycles() == []


def test_a_cycle_would_be_found() -> None:
    GRAPH["naiad.core.errors"]["naiad.service.face"] = 0  # the core importing the face: a cycle through it
    try:
        assert any("naiad.core.errors" in c and "naiad.service.face" in c for c in _cycles())
    finally:
        del GRAPH["naiad.core.errors"]["naiad.service.face"]
