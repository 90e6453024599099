"""gatelab's layers, declared once: a module imports only from its own layer or those below it, and no two modules
import each other, directly or round a circle. Imports inside functions count: a lazy import is still a dependency.

From the bottom: the errors; the host and other leaves (the metric catalogue among them); the config; its files
(YAML, --set); tracking, progress and the workspace (where runs live); data; the variant registry and the model;
evaluation; training; sweeps; reports; benchmarks; what commands do (app); the command line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gatelab"
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "errors"),  # the package's __init__ runs before any of its modules: it imports none
    ("host", "paper", "output_folders", "interrupts", "devices", "metrics"),
    ("config",),
    ("config_files",),  # above the config, so the schema never reads a file
    ("store_uris", "store_checks", "tracking", "tracked_run", "metric_outbox", "progress", "workspace"),
    ("data",),
    ("variants", "model"),
    ("eval",),
    ("train",),
    ("sweep",),
    ("report",),
    ("bench",),
    ("app",),
    ("cli", "__main__"),
)
LAYER_OF = {unit: index for index, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """The layer unit of a module: its top-level module or subpackage under gatelab."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The gatelab modules `path` imports anywhere in it (a `from gatelab.x import y` of a submodule y counts as y)."""
    found = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("gatelab")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            if not base.startswith("gatelab"):
                continue
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {name for name in found if name in modules}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    return {module_name(path): imported_modules(path, modules) - {module_name(path)} for path in paths}


def test_every_unit_of_the_package_has_a_layer(graph):
    assert {unit_of(module) for module in graph} - set(LAYER_OF) == set()


def test_no_import_runs_upward(graph):
    upward = sorted(f"{module} ({unit_of(module)}) imports {target} ({unit_of(target)})"
                    for module, targets in graph.items() for target in targets
                    if LAYER_OF[unit_of(target)] > LAYER_OF[unit_of(module)])
    assert upward == []


def test_no_modules_import_each_other_round_a_circle(graph):
    """Tarjan's strongly connected components of the module graph: every one a single module."""
    index_of: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index_of[module] = low[module] = len(index_of)
        stack.append(module)
        on_stack.add(module)
        for target in graph[module]:
            if target not in index_of:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index_of[target])
        if low[module] == index_of[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index_of:
            visit(module)
    assert circles == []


def test_the_check_sees_an_upward_import_and_a_circle(tmp_path):
    """The checks can fail: an import inside a function counts, and so does a submodule imported by name."""
    (tmp_path / "gatelab" / "data").mkdir(parents=True)
    (tmp_path / "gatelab" / "__init__.py").write_text("")
    (tmp_path / "gatelab" / "config.py").write_text("def f():\n    from gatelab.data import corpora\n")
    (tmp_path / "gatelab" / "data" / "__init__.py").write_text("")
    (tmp_path / "gatelab" / "data" / "corpora.py").write_text("from gatelab import config\n")
    modules = {"gatelab", "gatelab.config", "gatelab.data", "gatelab.data.corpora"}
    import tests.test_layers as layers

    package = layers.PACKAGE
    try:
        layers.PACKAGE = tmp_path / "gatelab"
        assert imported_modules(tmp_path / "gatelab" / "config.py", modules) == {"gatelab.data.corpora"}
        assert imported_modules(tmp_path / "gatelab" / "data" / "corpora.py", modules) == {"gatelab.config"}
    finally:
        layers.PACKAGE = package
    assert LAYER_OF[unit_of("gatelab.data.corpora")] > LAYER_OF[unit_of("gatelab.config")]


# issue 32: a function a reader takes in at once; data tables are module constants, not functions
MAX_FUNCTION_LINES = 60
# the command line stays a thin map from arguments to gatelab.app: its lines but the imports, which ruff's isort lays
# out one name a line
MAX_CLI_LINES = 300


def lines_but_imports(path: Path) -> int:
    tree = ast.parse(path.read_text(), str(path))
    imports = sum(node.end_lineno - node.lineno + 1 for node in tree.body
                  if isinstance(node, (ast.Import, ast.ImportFrom)))
    return len(path.read_text().splitlines()) - imports


def long_functions(package: Path) -> list[str]:
    """Every function or method of `package` longer than MAX_FUNCTION_LINES (its def line to its last), as
    'path:line name (N lines)'."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_a_screen_and_the_command_line_stays_thin():
    assert long_functions(PACKAGE) == []
    assert lines_but_imports(PACKAGE / "cli.py") < MAX_CLI_LINES


def test_the_length_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}\n")
    assert long_functions(tmp_path) == [f"{tmp_path.name}/long.py:5 long ({MAX_FUNCTION_LINES + 1} lines)"]
