"""The package's shape: layers import one way, no import cycles, only the book draws. (Modules follow concepts; no
line cap: a cap made files split where no concept ends.)"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "papa_lib"
#: Each layer may import only from the layers before it in this list.
LAYERS = ["core", "experiments", "analysis", "book", "ops", "top"]
#: Leaf modules any layer may use: they import nothing from the package (tiny random models and generated data; the
#: error classes every layer raises).
LEAVES = {"papa_lib.smoke", "papa_lib.errors"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in LAYERS else "top"


def _imports(path: Path) -> set[str]:
    """Every papa_lib module a file imports, at top level or inside functions."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("papa_lib"):
                names = [f"{target}.{alias.name}" for alias in node.names]
                found.update(name if (PACKAGE.parent / (name.replace(".", "/") + ".py")).exists()
                             or (PACKAGE.parent / name.replace(".", "/")).is_dir() else target for name in names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("papa_lib"))
    return found - {module}


def _graph() -> dict[str, set[str]]:
    return {_module_name(path): _imports(path) for path in PACKAGE.rglob("*.py")}


def test_layers_import_one_way():
    order = {name: i for i, name in enumerate(LAYERS)}
    wrong = []
    for module, targets in _graph().items():
        for target in targets:
            if target == "papa_lib" or target in LEAVES:
                continue
            if order[_layer(target)] > order[_layer(module)]:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "lower layers import higher ones:\n" + "\n".join(sorted(wrong))
    assert all(not _graph()[leaf] for leaf in LEAVES)


def test_no_import_cycles():
    graph = {m: {t for t in ts if t in _graph_keys()} for m, ts in _graph().items()}
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in graph.get(node, ()):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _graph_keys() -> set[str]:
    return {_module_name(path) for path in PACKAGE.rglob("*.py")}


def test_only_the_book_draws():
    """Computing apart from drawing: analysis functions return tables; only ``papa_lib/book`` imports altair."""
    drawing = []
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] == "book":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            drawing += [f"{path.relative_to(PACKAGE)}:{node.lineno} imports {n}" for n in names
                        if n.split(".")[0] in {"altair", "matplotlib", "vl_convert"}]
    assert not drawing, "drawing outside papa_lib/book:\n" + "\n".join(drawing)
