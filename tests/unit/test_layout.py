"""The layout rules of the code base, checked by parsing it (pure logic, no imports of the service).

- imports flow one way: each room of services/ imports only the rooms below it, and there are no cycles;
- tools never import tests: services/, harness/, bench/ and locustfile.py stand on their own;
- no module under tests/ imports a test module (`test_*.py`): fakes, helpers and fixtures they share
  live in tests/fakes.py, the system tests' helpers.py and the conftests;
- nothing but the tests imports app.py;
- docs/layout.md names every module of DOCUMENTED_PLACES, and only modules that exist;
- rooms stay small: functions under MAX_FUNCTION_LINES (or listed in LONG_FUNCTIONS with the reason),
  modules under MAX_MODULE_LINES. Past about 300 lines a module is worth a look for a second concern,
  but it is split by concern, never packed to fit: code is laid out as the formatter lays it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from scripts.import_graph import ROOT, find_cycles, import_graph, imports_of, package_graph, service_files

# From the top down: a room may import the rooms after it, never those before it.
LAYERS = (
    "app",
    "services.web",
    "services.admin",
    "services.runtime",
    "services.api",
    "services.observability",
    "services.usage",
    "services.accounts",
    "services.presets",
    "services.transfer",
    "services.history",
    "services.audit",
    "services.chat",
    "services.documents",
    "services.admission",
    "services.engine",
    "services.memory",
    "services.config",
)
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 40
# Functions allowed to be longer, and why.
LONG_FUNCTIONS: dict[str, str] = {
    "services/web/routes.py:install_routes": "the route handlers are closures over the runtime",
    "services/web/upload_guard.py:_guarded_call": "one ASGI call: its receive and send wrappers share state",
}


LAYOUT_DOC = ROOT / "docs" / "layout.md"
# Every module under these is named in LAYOUT_DOC (a package's __init__.py may be); bench/README.md
# describes the benchmarks by topic.
DOCUMENTED_PLACES = ("services", "harness", "scripts", "deploy")


def python_files(*places: str) -> list[Path]:
    files: list[Path] = []
    for place in places:
        path = ROOT / place
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def test_services_have_no_import_cycles() -> None:
    assert find_cycles(import_graph(service_files())) == []


def test_the_cycle_check_finds_a_cycle_added_on_purpose(tmp_path: Path) -> None:
    package = tmp_path / "services"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "first.py").write_text("from services.second import thing\n")
    (package / "second.py").write_text("def f():\n    from services import first\n")
    (package / "third.py").write_text("import services.first\n")
    graph = import_graph(sorted(package.rglob("*.py")), root=tmp_path)
    assert find_cycles(graph) == [["services.first", "services.second"]]


def test_rooms_import_only_the_rooms_below_them() -> None:
    packages = package_graph(import_graph(service_files()))
    rank = {layer: index for index, layer in enumerate(LAYERS)}
    unknown = sorted(name for name in packages if name not in rank and name != "services")
    assert not unknown, f"add {unknown} to LAYERS in its place"
    upward = [
        f"{source} imports {target}"
        for source, targets in packages.items()
        for target in targets
        if source in rank and target in rank and rank[target] <= rank[source]
    ]
    assert not upward, upward


@pytest.mark.parametrize("place", ["services", "harness", "bench", "locustfile.py", "scripts"])
def test_tools_never_import_tests_or_the_app(place: str) -> None:
    offending = {
        str(path.relative_to(ROOT)): sorted(
            name for name in imports_of(path) if name.split(".")[0] in ("tests", "app")
        )
        for path in python_files(place)
    }
    assert not {path: names for path, names in offending.items() if names}


def imports_of_test_modules(root: Path = ROOT) -> list[str]:
    """`importer -> test module` for each module under `root`/tests that imports a `test_*` module."""
    graph = import_graph(sorted((root / "tests").rglob("*.py")), root=root)
    return sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if target.rpartition(".")[2].startswith("test_")
    )


def test_no_test_module_imports_another() -> None:
    imports = imports_of_test_modules()
    assert not imports, f"move what they share to tests/fakes.py, a helpers module or a conftest: {imports}"


def test_the_test_import_check_finds_one_added_on_purpose(tmp_path: Path) -> None:
    unit = tmp_path / "tests" / "unit"
    unit.mkdir(parents=True)
    for package in (tmp_path / "tests", unit):
        (package / "__init__.py").write_text("")
    (tmp_path / "tests" / "fakes.py").write_text("class FakeClock: ...\n")
    (unit / "test_sessions.py").write_text("from tests.fakes import FakeClock\n")
    (unit / "test_turns.py").write_text("from tests.unit.test_sessions import FakeClock\n")
    (unit / "test_rewinds.py").write_text("def f():\n    from tests.unit import test_turns\n")
    assert imports_of_test_modules(tmp_path) == [
        "tests.unit.test_rewinds -> tests.unit.test_turns",
        "tests.unit.test_turns -> tests.unit.test_sessions",
    ]


def test_modules_stay_small() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in python_files("services")
    }
    assert not {path: lines for path, lines in sizes.items() if lines > MAX_MODULE_LINES}


def test_functions_stay_short() -> None:
    long: dict[str, int] = {}
    for path in [*python_files("services"), ROOT / "app.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                name = f"{path.relative_to(ROOT)}:{node.name}"
                if lines > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS:
                    long[name] = lines
    assert not long, f"split them, or list them in LONG_FUNCTIONS with a reason: {long}"


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def lazy_exports() -> list[tuple[Path, str, str]]:
    """(package folder, exported name, "module:attribute") of every package that imports on first use."""
    found = []
    for init in python_files("services"):
        if init.name != "__init__.py":
            continue
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["_EXPORTS"]:
                table = ast.literal_eval(node.value)
                found += [(init.parent, name, where) for name, where in table.items()]
    return found


def test_lazy_exports_name_what_their_modules_define() -> None:
    assert lazy_exports(), "services.engine and services.memory export their names on first use"
    wrong = []
    for package, name, where in lazy_exports():
        module, _, attribute = where.partition(":")
        path = package.joinpath(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if not path.is_file() or attribute not in _top_level_names(ast.parse(path.read_text())):
            wrong.append(f"{package.relative_to(ROOT)}: {name} -> {where}")
    assert not wrong, wrong


def modules_named(layout: str) -> set[str]:
    """The `*.py` paths a layout table names: each row's module names are relative to its first cell's
    folder (`backends/local/engine.py` under `services/engine/`), unless they start at the root."""
    named: set[str] = set()
    for line in layout.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        place = re.fullmatch(r"`([\w./]+)`", cells[0]) if line.startswith("|") else None
        if place is None:
            continue
        folder = place.group(1).rstrip("/")
        if folder.endswith(".py"):
            named.add(folder)
            folder = folder.rpartition("/")[0]
        for name in re.findall(r"`([\w./]+\.py)`", " ".join(cells[1:])):
            at_root = name.split("/")[0] in (*DOCUMENTED_PLACES, "tests", "bench")
            named.add(name if at_root or not folder else f"{folder}/{name}")
    return named


def test_modules_named_resolves_each_name_in_its_row() -> None:
    layout = (
        "| Path | What it holds |\n|---|---|\n| `app.py` | handlers |\n"
        "| `services/engine/` | `chat_engine.py`, `backends/local/engine.py`; see `services/web/edge.py` |\n"
        "| `scripts/` | `run.sh` and `import_graph.py`. |\n"
    )
    assert modules_named(layout) == {
        "app.py",
        "services/engine/chat_engine.py",
        "services/engine/backends/local/engine.py",
        "services/web/edge.py",
        "scripts/import_graph.py",
    }


def test_the_layout_doc_names_every_module_and_only_real_ones() -> None:
    named = modules_named(LAYOUT_DOC.read_text())
    modules = {
        str(path.relative_to(ROOT)) for path in python_files(*DOCUMENTED_PLACES) if path.name != "__init__.py"
    }
    missing = sorted(modules - named)
    unknown = sorted(name for name in named if not (ROOT / name).is_file())
    assert not missing and not unknown, (
        f"docs/layout.md leaves out {missing} (name each in its folder's row) and names {unknown}, "
        "which are no modules"
    )
