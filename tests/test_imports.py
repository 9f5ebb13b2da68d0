"""Import discipline: pure modules use only the standard library; ``import instrument`` stays light."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "instrument"
PURE_MODULES = ["schedule", "naming", "ranks", "timeline", "_checks", "_warnings"]
HEAVY = ["torch", "nvtx", "vllm", "ray", "prometheus_client", "matplotlib", "yaml"]


def _imported_roots(path: Path) -> set[str]:
    """Top-level packages imported, except that another pure module counts as itself (allowed)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # a relative import reaches into the package
                roots.add("instrument")
            elif node.module in {f"instrument.{m}" for m in PURE_MODULES}:
                roots.add(node.module)
            elif node.module:
                roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_modules_import_only_the_standard_library(module: str) -> None:
    roots = _imported_roots(PACKAGE / f"{module}.py")
    assert roots, "the AST walk found no import at all"
    pure = {f"instrument.{m}" for m in PURE_MODULES}
    outside = sorted(root for root in roots if root not in sys.stdlib_module_names and root not in pure)
    assert outside == [], f"instrument/{module}.py imports {outside}"


def test_the_ast_check_sees_third_party_imports() -> None:
    # config/_settings.py imports attrs: the same check must flag it, or the test above proves nothing.
    assert "attrs" in _imported_roots(PACKAGE / "config" / "_settings.py") - set(sys.stdlib_module_names)


def test_import_instrument_loads_no_heavy_dependency() -> None:
    code = (
        "import sys, instrument, instrument.cli, instrument.config, instrument.schedule, instrument.naming, "
        f"instrument.ranks; print(','.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert loaded == ""


def _public_modules() -> list[str]:
    names = ["instrument"]
    names += [f"instrument.{p.stem}" for p in sorted(PACKAGE.glob("*.py")) if not p.stem.startswith("_")]
    return names


@pytest.mark.parametrize("module_name", _public_modules())
def test_every_public_name_has_a_docstring(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__doc__, f"{module_name} has no module docstring"
    for name in getattr(module, "__all__", []):
        obj = getattr(module, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert inspect.getdoc(obj), f"{module_name}.{name} has no docstring"
            for attr, member in vars(obj).items() if inspect.isclass(obj) else []:
                if not attr.startswith("_") and inspect.isfunction(member):
                    assert inspect.getdoc(member), f"{module_name}.{name}.{attr} has no docstring"


def _module_imports(root: Path) -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports, function-level imports included.

    ``from package import name`` counts as importing ``package.name`` when that is a module, else ``package``;
    the package ``__init__`` every submodule import runs first is not counted (it re-exports, by design).
    """
    modules: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges[name].update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    above = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*above, base] if base else above)
                submodules = {f"{base}.{alias.name}" for alias in node.names} & modules.keys()
                edges[name].update(submodules or ({base} & modules.keys()))
                if submodules and len(submodules) < len(node.names) and base in modules:
                    edges[name].add(base)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (or one importing itself), by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in edges[node]:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_even_inside_functions() -> None:
    cycles = _cycles(_module_imports(PACKAGE))
    assert cycles == [], f"modules that import each other (directly or through others): {cycles}"


def test_the_cycle_check_finds_a_planted_cycle(tmp_path: Path) -> None:
    planted = tmp_path / "instrument"
    (planted / "sub").mkdir(parents=True)
    (planted / "__init__.py").write_text("")
    (planted / "sub" / "__init__.py").write_text("")
    (planted / "a.py").write_text("def f():\n    from instrument.sub import b\n")  # a function-level import
    (planted / "sub" / "b.py").write_text("from instrument import a\n")
    assert _cycles(_module_imports(planted)) == [["instrument.a", "instrument.sub.b"]]


# --------------------------------------------------------------------------- the analyze package's layers

ANALYZE_LAYERS = {"model": 0, "traces": 1, "analyzers": 2, "render": 3}
"""model <- traces <- analyzers <- render: each imports only its own layer and those below; the package's root
(the entry points: analyze, compare, the command lines, the layout export) may import any of them."""
ROOT_LAYER = 4


def _analyze_layer(module: str) -> int | None:
    """The layer of an ``instrument.analyze`` module; ``None`` outside the package."""
    parts = module.split(".")
    if parts[:2] != ["instrument", "analyze"]:
        return None
    return ANALYZE_LAYERS.get(parts[2], ROOT_LAYER) if len(parts) > 2 else ROOT_LAYER


def _layer_violations(edges: dict[str, set[str]]) -> list[str]:
    """Every import of an analyze module by one below it, and of anything but the model by a renderer."""
    wrong = []
    for source, targets in sorted(edges.items()):
        low = _analyze_layer(source)
        if low is None:
            continue
        for target in sorted(targets):
            high = _analyze_layer(target)
            if high is None:
                continue
            if high > low or (low == ANALYZE_LAYERS["render"] and high not in (0, low)):
                wrong.append(f"{source} imports {target}")
    return wrong


def test_analyze_layers_import_only_downwards() -> None:
    assert _layer_violations(_module_imports(PACKAGE)) == []


def test_the_layer_check_finds_planted_violations(tmp_path: Path) -> None:
    planted = tmp_path / "instrument"
    for folder in ("analyze/model", "analyze/traces", "analyze/analyzers", "analyze/render"):
        (planted / folder).mkdir(parents=True)
        (planted / folder / "__init__.py").write_text("")
    (planted / "__init__.py").write_text("")
    (planted / "analyze" / "__init__.py").write_text("")
    (planted / "analyze" / "model" / "_report.py").write_text(
        "def f():\n    from instrument.analyze.traces import _reader\n"
    )
    (planted / "analyze" / "traces" / "_reader.py").write_text("from instrument.analyze.model import _report\n")
    (planted / "analyze" / "analyzers" / "_stats.py").write_text("from instrument.analyze.render import _text\n")
    (planted / "analyze" / "render" / "_text.py").write_text("from instrument.analyze.traces import _reader\n")
    (planted / "analyze" / "_cli.py").write_text("from instrument.analyze.render import _text\n")  # the root: allowed
    assert _layer_violations(_module_imports(planted)) == [
        "instrument.analyze.analyzers._stats imports instrument.analyze.render._text",
        "instrument.analyze.model._report imports instrument.analyze.traces._reader",
        "instrument.analyze.render._text imports instrument.analyze.traces._reader",
    ]


# --------------------------------------------------------------------------- what the tests import

TESTS = Path(__file__).resolve().parent


def _private_imports_with_a_public_name(paths: list[Path]) -> list[str]:
    """``from instrument.x._y import name`` where a public package above ``_y`` exports the same object."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith("instrument"):
                continue
            parts = (node.module or "").split(".")
            first_private = next((i for i, part in enumerate(parts) if part.startswith("_")), None)
            if first_private is None:
                continue
            module = importlib.import_module(node.module or "")
            public = [".".join(parts[:i]) for i in range(first_private, 0, -1)]
            for alias in node.names:
                held = getattr(module, alias.name, None)
                for name in public:
                    above = importlib.import_module(name)
                    if alias.name in getattr(above, "__all__", ()) and getattr(above, alias.name) is held:
                        found.append(f"{path.name}: {node.module}.{alias.name} is {name}.{alias.name}")
                        break
    return found


def test_tests_import_a_public_name_where_one_exists() -> None:
    assert _private_imports_with_a_public_name(sorted(TESTS.rglob("*.py"))) == []


def test_the_public_name_check_finds_a_planted_private_import(tmp_path: Path) -> None:
    planted = tmp_path / "test_planted.py"
    planted.write_text(
        "from instrument.analyze.model._report import Report, label_key\n"
        "from instrument.analyze.traces._reader import scan_file\n"  # private, with no public name: allowed
    )
    assert _private_imports_with_a_public_name([planted]) == [
        "test_planted.py: instrument.analyze.model._report.Report is instrument.analyze.model.Report",
        "test_planted.py: instrument.analyze.model._report.label_key is instrument.analyze.model.label_key",
    ]
