"""The import graph of ``lorien/`` and ``dialects/``: no circles, layers that only look down.

Every ``import`` and ``from ... import`` statement of every file counts, at module level,
inside functions and under ``if TYPE_CHECKING:`` alike, resolved to the file it names
(``from package import module`` names the module's file; a name defined in a package's
``__init__.py`` names that file). Importing a submodule runs its parents' ``__init__.py``
too, but that is not an edge here: a package that imports its own submodules is no circle
unless a submodule imports the package back.

The layers of ``lorien/``, lowest first; a module may import its own layer and those below:

1. base: ``lorien/{errors,record,target,workload,native,progress,plugins}.py`` -- the data
   model, targets, workload keys, and finding the installed dialect plugins
   (:mod:`lorien.plugins`); and what a one-shot query needs without pyarrow:
   ``lorien/{storeuri,partitions,serving_index}.py`` (which store, its partition directories,
   the persisted serving index file).
2. formats: ``lorien/formats/`` -- the codecs of the native logs.
3. dialect: ``lorien/dialect.py`` -- the plugin boundary, the ``Dialect`` interface and
   the tables derived from the registered dialects (which dialect owns a format, whose
   workload key is this). It sits above the codecs, since its default ``write_log`` writes
   through them and the native log of a dialect is a codec fact, and below the warehouse,
   which asks it which dialect a format's records belong to. So it never names a store type.
4. warehouse: ``lorien/warehouse/`` -- stores and the log archive.
5. everything else in ``lorien/`` (engine, search, tune, features, costmodel, models, cli,
   ingest, build, the package's ``__init__.py``), then ``dialects/``.

The rule is checked for the four lower layers. ``lorien/`` never imports ``dialects`` by
name (statically or through ``importlib.import_module("dialects...")``): dialects are
found through the ``lorien.dialects`` entry points only. No dialect package imports another
one (``dialects/meta_schedule`` nothing of ``dialects/auto_scheduler``, and so on): code two
dialects share lives in ``lorien/``, so each dialect ships, and can be removed, on its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lorien", "dialects")
BASE_MODULES = {f"lorien.{name}" for name in ("errors", "record", "target", "workload", "native", "progress",
                                              "plugins", "storeuri", "partitions", "serving_index")}
#: Layer names, lowest first; everything not named here is above them all.
LAYERS = ("base", "formats", "dialect", "warehouse")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _files() -> dict[str, Path]:
    return {_module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


FILES = _files()


def _resolve(name: str) -> str | None:
    """The module file an imported dotted name lives in (its longest known prefix)."""
    while name and name not in FILES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> list[tuple[str, int, str]]:
    """(imported dotted name, line, importing statement's module) of every import statement."""
    found = []
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            found += [(f"{base}.{alias.name}", node.lineno, base) for alias in node.names]
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module of lorien/ or dialects/: line of the first such import}."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in FILES.items():
        edges: dict[str, int] = {}
        for name, line, statement_module in _imports(module, path):
            target = name if name in FILES else _resolve(statement_module)
            if target is not None and target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    return sorted(found)


def layer_of(module: str) -> int:
    """Position of a module's layer in LAYERS; len(LAYERS) for everything above them."""
    if module in BASE_MODULES:
        return LAYERS.index("base")
    if module == "lorien.formats" or module.startswith("lorien.formats."):
        return LAYERS.index("formats")
    if module == "lorien.dialect":
        return LAYERS.index("dialect")
    if module == "lorien.warehouse" or module.startswith("lorien.warehouse."):
        return LAYERS.index("warehouse")
    return len(LAYERS)


def dialect_package(module: str) -> str | None:
    """The dialect package a module belongs to (``dialects.auto_scheduler`` of
    ``dialects.auto_scheduler.steps``); None outside one."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "dialects" and len(parts) > 1 else None


def _describe(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    members = set(component)
    edges = [f"{FILES[a].relative_to(ROOT)}:{line} -> {FILES[b].relative_to(ROOT)}"
             for a in component for b, line in graph[a].items() if b in members]
    return "\n  ".join(edges)


def test_the_import_graph_sees_the_known_edges():
    graph = import_graph()
    assert "lorien.formats.base" in graph["lorien.formats"]
    assert "lorien.dialect" in graph["dialects.autotvm.dialect"]
    assert "lorien.engine.dag" in graph["dialects.meta_schedule.trace"]
    assert dialect_package("dialects.meta_schedule.trace") == "dialects.meta_schedule"
    assert dialect_package("dialects") is None and dialect_package("lorien.engine.dag") is None


def test_no_file_of_lorien_or_dialects_is_in_an_import_circle():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import circles:\n  " + "\n\n  ".join(_describe(graph, c) for c in found)


def test_the_lower_layers_never_import_a_layer_above_them():
    offenders = [f"{FILES[module].relative_to(ROOT)}:{line} imports {imported} "
                 f"({LAYERS[layer_of(module)]} layer imports a higher one)"
                 for module, edges in import_graph().items() if layer_of(module) < len(LAYERS)
                 for imported, line in edges.items() if layer_of(imported) > layer_of(module)]
    assert offenders == []


def _imports_dialects(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "dialects" for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and (node.module or "").split(".")[0] == "dialects"
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
        first = node.args[0] if node.args else None
        return isinstance(first, ast.Constant) and str(first.value).split(".")[0] == "dialects"
    return False


def test_lorien_never_imports_the_dialects_package_by_name():
    offenders = [f"{path.relative_to(ROOT)}:{node.lineno}" for module, path in FILES.items()
                 if module.split(".")[0] == "lorien"
                 for node in ast.walk(ast.parse(path.read_text())) if _imports_dialects(node)]
    assert offenders == []


def test_no_dialect_package_imports_another_dialect_package():
    offenders = [f"{FILES[module].relative_to(ROOT)}:{line} imports {imported}"
                 for module, edges in import_graph().items() if dialect_package(module)
                 for imported, line in edges.items()
                 if dialect_package(imported) not in (None, dialect_package(module))]
    assert offenders == [], "code dialects share belongs in lorien/:\n  " + "\n  ".join(offenders)
