"""Layers: no arrow runs back up. ``instrument/config/`` imports nothing above it, and ``instrument/integrations/``
imports no private run module (``instrument.run.controller`` is what a controller gets).

Read from the source with ``ast``, every import at any depth (lazy ones inside functions too) and
``importlib.import_module("...")`` / ``__import__("...")`` with a literal name; the checker is run on
planted sources too, so a pass means something.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "instrument"
ABOVE_CONFIG = ("recorders", "run", "rollout", "finish", "analyze", "integrations")
"""The packages that build on the configuration: config imports none of them (nor the package root)."""


def _sources(root: Path) -> dict[str, tuple[str, bool]]:
    """Dotted module name -> (its source, whether it is a package ``__init__``), for every module under ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path.read_text(encoding="utf-8"), package)
    return found


def imports_of(source: str, module: str, modules: frozenset[str], *, package: bool = False) -> set[str]:
    """The modules ``source`` (module ``module``) imports, dotted: ``from a import b`` is ``a.b`` when that is a
    module (in ``modules``), else ``a``; relative imports are resolved against ``module``."""
    here = module if package else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                above = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*above, base] if base else above)
            for alias in node.names:
                name = f"{base}.{alias.name}"
                targets.add(name if name in modules else base)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in {"import_module", "__import__"} and isinstance(node.args[0].value, str):
                targets.add(node.args[0].value)
    return targets


def _above_config(target: str) -> bool:
    return target == "instrument" or any(
        target == f"instrument.{name}" or target.startswith(f"instrument.{name}.") for name in ABOVE_CONFIG
    )


def _private_run(target: str) -> bool:
    parts = target.split(".")
    return len(parts) > 2 and parts[:2] == ["instrument", "run"] and parts[2].startswith("_")


RULES: tuple[tuple[str, Callable[[str], bool], str], ...] = (
    ("instrument.config", _above_config, "a package above config"),
    ("instrument.integrations", _private_run, "a private run module"),
)
"""(the modules under this package, a forbidden import target, what it is)."""


def violations(sources: Mapping[str, tuple[str, bool]]) -> list[str]:
    """``"module imports target (what it is)"`` for every import that breaks a rule, sorted."""
    modules = frozenset(sources)
    found = []
    for module, (source, package) in sources.items():
        for prefix, forbidden, what in RULES:
            if module == prefix or module.startswith(prefix + "."):
                for target in sorted(imports_of(source, module, modules, package=package)):
                    if forbidden(target):
                        found.append(f"{module} imports {target} ({what})")
    return sorted(found)


def test_config_imports_nothing_above_it_and_integrations_no_private_run_module() -> None:
    assert violations(_sources(PACKAGE)) == []


def test_the_checker_reads_the_real_imports() -> None:
    sources = _sources(PACKAGE)
    modules = frozenset(sources)
    validators, _ = sources["instrument.config._validators"]
    assert "instrument._tools" in imports_of(validators, "instrument.config._validators", modules)
    ray, _ = sources["instrument.integrations.ray"]
    assert "instrument.run.controller" in imports_of(ray, "instrument.integrations.ray", modules)


def test_the_checker_catches_planted_violations() -> None:
    planted = {
        "instrument.config._lazy": ("def tool():\n    from instrument import recorders\n", False),
        "instrument.config._relative": ("from ..run import _session\n", False),
        "instrument.config._root": ("import instrument\n", False),
        "instrument.config._dynamic": ("import importlib\nimportlib.import_module('instrument.rollout.vllm')\n", False),
        "instrument.config._fine": ("from instrument import ranks\nfrom instrument.config import _memory\n", False),
        "instrument.integrations.lazy": ("class A:\n    def f(self):\n        import instrument.run._clock\n", False),
        "instrument.integrations.named": ("from instrument.run import _timeline\n", False),
        "instrument.integrations.fine": ("from instrument.run.controller import Sample\nimport instrument\n", False),
    }
    sources = {**_sources(PACKAGE), **planted}
    assert violations(sources) == [
        "instrument.config._dynamic imports instrument.rollout.vllm (a package above config)",
        "instrument.config._lazy imports instrument.recorders (a package above config)",
        "instrument.config._relative imports instrument.run._session (a package above config)",
        "instrument.config._root imports instrument (a package above config)",
        "instrument.integrations.lazy imports instrument.run._clock (a private run module)",
        "instrument.integrations.named imports instrument.run._timeline (a private run module)",
    ]
