"""Print the import graph of services/ (and app.py), and any import cycle in it.

    python scripts/import_graph.py            # modules, each with what it imports from the project
    python scripts/import_graph.py --packages # the same, one line per package (services.chat, ...)

Only the project's own modules are shown. Imports inside functions and under
`if TYPE_CHECKING:` count too: a cycle is a cycle wherever the import sits.
Standard library only, so it runs before any set-up.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = ("services", "harness", "bench", "tests", "scripts")


def module_name(path: Path, root: Path = ROOT) -> str:
    """`services/chat/store.py` -> `services.chat.store`; a package's `__init__.py` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """The project modules `path` imports (absolute or relative), wherever the import statement sits."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own = module_name(path, root)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {name for name in found if name.split(".")[0] in (*PROJECT_PACKAGES, "app")}


def project_modules(paths: Iterable[Path], root: Path = ROOT) -> dict[str, Path]:
    return {module_name(path, root): path for path in paths}


def import_graph(paths: Iterable[Path], root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports (names that are not modules, e.g. classes, dropped)."""
    modules = project_modules(paths, root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {target for target in imports_of(path, root) if target in modules and target != name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def package_graph(graph: dict[str, set[str]], depth: int = 2) -> dict[str, set[str]]:
    """The module graph folded to packages (`services.chat.store` -> `services.chat`)."""

    def fold(name: str) -> str:
        return ".".join(name.split(".")[:depth])

    folded: dict[str, set[str]] = {}
    for source, targets in graph.items():
        folded.setdefault(fold(source), set()).update(fold(t) for t in targets if fold(t) != fold(source))
    return folded


def service_files(root: Path = ROOT) -> list[Path]:
    return sorted([root / "app.py", *(root / "services").rglob("*.py")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--packages", action="store_true", help="one line per package instead of per module")
    args = parser.parse_args(argv)
    files = project_modules(service_files())
    graph = import_graph(files.values())
    shown = package_graph(graph) if args.packages else graph
    width = max(len(name) for name in shown)
    for name in sorted(shown):
        size = "" if args.packages else f"{len(files[name].read_text().splitlines()):>4} lines  "
        print(f"{name:<{width}}  {size}-> {', '.join(sorted(shown[name])) or '-'}")
    cycles = find_cycles(graph)
    for cycle in cycles:
        print(f"CYCLE: {' <-> '.join(cycle)}", file=sys.stderr)
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
