"""What ships and how it hangs together: the wheel holds the library only, and ``instrument`` has no import cycle.

The wheel is built offline from a copy of the source tree (``pip wheel --no-build-isolation
--no-index``), so a build never writes into the checkout other work shares. The import graph is
read from the source with ``ast``: edges are the imports a module runs, at module level or inside
a function; ``if TYPE_CHECKING:`` blocks never run and are left out. A function-level import may
close a cycle only if a comment on its line (or the line above) says ``cycle`` and why.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from instrument import _shipped

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "instrument"
HANG_GUARD_S = 300  # only against a hang: the assertions are about contents and exit statuses
DISTRIBUTION = "instrument-rl"  # the name users install; `instrument` on PyPI is an unrelated project (issue 32)
WHEEL_NAME = DISTRIBUTION.replace("-", "_")  # as a wheel's file and its .dist-info spell it


# --------------------------------------------------------------------------- the import graph


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` (both dotted module names) at ``line``."""

    source: str
    target: str
    line: int
    in_function: bool
    documented: bool


def _modules(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of the package (packages as their ``__init__``)."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imports(module: str, path: Path) -> Iterator[tuple[str, int, bool]]:
    """``(imported dotted name, line, inside a function)`` for every import that runs."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(nodes: list[ast.stmt], in_function: bool) -> Iterator[tuple[str, int, bool]]:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from visit(node.orelse, in_function)  # the body runs only under a type checker
                continue
            if isinstance(node, ast.Import):
                yield from ((alias.name, node.lineno, in_function) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: up level-1 packages from this module's package
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                yield from ((f"{base}.{alias.name}", node.lineno, in_function) for alias in node.names)
            inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, None) or []:
                    # except handlers and match cases are not statements but hold statements
                    yield from visit([child] if isinstance(child, ast.stmt) else child.body, inner)

    yield from visit(ast.parse(path.read_text(encoding="utf-8")).body, False)


def import_graph(package_dir: Path) -> list[Edge]:
    """Every import of one of the package's modules by another (``from pkg import name`` -> ``pkg``)."""
    modules = _modules(package_dir)
    edges = []
    for module, path in modules.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for name, line, in_function in _imports(module, path):
            target = name
            while target and target not in modules:  # ``pkg.mod.Class`` -> ``pkg.mod``; outside modules -> ""
                target = target.rpartition(".")[0]
            if target and target != module:
                near = " ".join(lines[max(0, line - 2) : line]).lower()
                edges.append(Edge(module, target, line, in_function, "cycle" in near))
    return edges


def cycles(edges: list[Edge]) -> list[str]:
    """A description of every cycle problem: module-level cycles, and undocumented function-level closers."""
    module_level: dict[str, set[str]] = {}
    everything: dict[str, set[str]] = {}
    for edge in edges:
        everything.setdefault(edge.source, set()).add(edge.target)
        if not edge.in_function:
            module_level.setdefault(edge.source, set()).add(edge.target)

    def path(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
        """A path ``start`` -> ... -> ``goal`` (depth first), or ``None``."""
        stack, seen = [(start, [start])], {start}
        while stack:
            node, trail = stack.pop()
            if node == goal:
                return trail
            for nxt in sorted(graph.get(node, ())):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
        return None

    problems = []
    for edge in edges:
        back = path(module_level if not edge.in_function else everything, edge.target, edge.source)
        if back is None:
            continue
        loop = " -> ".join([edge.source, *back])
        if not edge.in_function:
            problems.append(f"module-level import cycle: {loop} (line {edge.line} of {edge.source})")
        elif not edge.documented:
            problems.append(f"{edge.source} line {edge.line}: a function-level import closes {loop}; say why (cycle)")
    return sorted(set(problems))


def test_the_package_has_no_import_cycle() -> None:
    edges = import_graph(PACKAGE)
    assert len(edges) > 50, "the AST walk found too few imports: it reads the wrong files"
    assert cycles(edges) == []


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "pkg"


def test_the_cycle_check_sees_cycles(tmp_path: Path) -> None:
    """The check must flag a cycle, or the test above proves nothing (relative imports, names, functions)."""
    package = _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import f\n",
            "pkg/a.py": "from . import b\ndef f():\n    from pkg import c\n",
            "pkg/b.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg import a\nfrom .sub.d import X\n",
            "pkg/c.py": "import pkg.a\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/d.py": "X = 1\ntry:\n    from ..a import f\nexcept ImportError:\n    pass\n",
        },
    )
    problems = cycles(import_graph(package))
    assert any(p.startswith("module-level import cycle: pkg.a -> pkg.b -> pkg.sub.d -> pkg.a") for p in problems)
    assert any("pkg.a line 3: a function-level import closes pkg.a -> pkg.c -> pkg.a" in p for p in problems)
    assert not any("TYPE_CHECKING" in p or p.startswith("pkg.b line 3") for p in problems)
    (package / "a.py").write_text("def f():\n    from pkg import c  # cycle: c imports a at module level\n")
    (package / "sub" / "d.py").write_text("X = 1\n")
    assert cycles(import_graph(package)) == []


@pytest.mark.slow  # imports torch, Ray and the rest in a fresh interpreter: ~6 s
def test_every_module_imports() -> None:
    """Each module of the package imports in a fresh interpreter, after nothing else of ours is loaded."""
    names = [m for m in _modules(PACKAGE) if m != "instrument.__main__"]  # __main__ runs the command line
    code = (
        "import importlib, sys\n"
        "failed = []\n"
        "for name in sys.argv[1:]:\n"
        "    for loaded in [m for m in sys.modules if m == 'instrument' or m.startswith('instrument.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "print('\\n'.join(failed))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=HANG_GUARD_S, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


# --------------------------------------------------------------------------- the wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built offline from a copy of the checkout (examples/ included in the copy on purpose)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    for name in ("instrument", "examples", "docs"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    command = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run(
        [*command, "-w", str(work / "dist")], capture_output=True, text=True, timeout=HANG_GUARD_S, check=False
    )
    assert done.returncode == 0, done.stderr
    # setuptools >= 77 warns on every build about a `project.license` table (issue 27)
    assert "deprecated" not in done.stdout + done.stderr, done.stdout + done.stderr
    (built,) = (work / "dist").glob(f"{WHEEL_NAME}-*.whl")
    return built


def test_the_wheel_holds_the_library_and_no_demo(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "instrument/__init__.py" in names and "instrument/config/_file.py" in names
    assert "instrument/py.typed" in names
    assert not [n for n in names if n.startswith("examples/")]
    assert not [n for n in names if "demo" in Path(n).name.lower()]
    assert not [n for n in names if n.endswith(".pyc")]
    # the example configurations and the docs' pages, as the checkout reads them (instrument/_shipped.py)
    shipped = {n for n in names if n.startswith(("instrument/examples/", "instrument/docs/"))}
    expected = {f"instrument/examples/{p.name}" for p in _shipped.examples().values()}
    expected |= {f"instrument/docs/{p.name}" for p in _shipped.doc_pages().values()}
    assert shipped == expected and "instrument/examples/verl_ppo.yaml" in shipped
    assert "instrument/docs/config.md" in shipped
    assert not [n for n in names if n.endswith((".yaml", ".yml")) and not n.startswith("instrument/examples/")]
    version = wheel.name.split("-")[1]
    assert {n.split("/")[0] for n in names} == {"instrument", f"{WHEEL_NAME}-{version}.dist-info"}


def test_the_wheel_carries_its_license(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        version = wheel.name.split("-")[1]
        metadata = archive.read(f"{WHEEL_NAME}-{version}.dist-info/METADATA").decode()
        assert archive.read(f"{WHEEL_NAME}-{version}.dist-info/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()


def test_the_installed_wheel_works_away_from_the_checkout(wheel: Path, tmp_path: Path) -> None:
    """Unpacked outside the checkout and run from elsewhere: the CLI works, reads a config file, has no ``demo``."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    config = tmp_path / "profile.yaml"
    config.write_text("steps: [2]\n")
    code = (
        "import sys, instrument, instrument.cli as cli\n"
        "print(instrument.__file__)\n"
        "print(instrument.ProfilerConfig.from_file(sys.argv[1], ['ranks=[1]']).ranks)\n"
        "print(cli.main(['plan', '--config', sys.argv[1], '--num-steps', '2']))\n"
        "print(cli.main(['plan', '--example', 'verl_ppo', '--num-steps', '4', '--world-size', '8']))\n"
        "print(cli.main(['docs', 'config']))\n"
        "cli.main(['demo'])\n"
    )
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert lines[0] == str(site / "instrument" / "__init__.py")  # the wheel's copy, not the checkout's
    assert lines[1] == "(1,)"
    assert "steps    2 of 1-2" in done.stdout and lines[-1] == "0"
    assert "steps    1, 3 of 1-4" in done.stdout  # verl_ppo.yaml, from inside the package
    assert "# Configuration" in lines
    assert done.returncode == 2  # argparse refuses the removed subcommand
    assert "invalid choice: 'demo'" in done.stderr


_LOOP = """\
import instrument as ins

@ins.profiled_stage("update_actor", scheduled=True)
def update(n):
    for i in range(n):
        with ins.profile_window(mini_batch=i):
            pass
    return n

run = ins.configure(ins.ProfilerConfig(tool="none", save_path="profile"), role="actor")
for step in (1, 2):
    with ins.profile_step(step, last=step == 2):
        assert update(3) == 3
ins.finish()
print("failures", run.failures)
"""


@pytest.mark.slow  # a venv and pip installing attrs and PyYAML from the package index: ~10 s
def test_the_wheel_in_a_venv_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    """``pip install`` the wheel into a fresh venv away from the checkout: the help, a plan of a shipped
    example, a documentation page and a profiled loop work as the README and ``--help`` say."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=HANG_GUARD_S)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    installed = subprocess.run(
        [*pip, str(wheel), "pyyaml"], capture_output=True, text=True, timeout=HANG_GUARD_S, check=False
    )
    if installed.returncode != 0 and "No matching distribution" in installed.stderr:
        pytest.skip(f"no package index to install attrs and PyYAML from: {installed.stderr.strip()[-200:]}")
    assert installed.returncode == 0, installed.stderr
    assert "deprecated" not in installed.stderr
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False
        )

    helped = run("instrument", "--help")
    assert helped.returncode == 0 and "instrument docs [PAGE]" in helped.stdout
    plan_help = run("instrument", "plan", "--help").stdout
    assert "--example verl_ppo" in plan_help and "instrument docs config" in plan_help
    planned = run("instrument", "plan", "--example", "verl_ppo", "--num-steps", "4", "--world-size", "8")
    assert planned.returncode == 0, planned.stderr
    assert "ranks    0, 4 of 8 (2 profiled)" in planned.stdout
    verl = run("instrument", "plan", "--example", "verl_keys.yaml", "--num-steps", "4", "--world-size", "8")
    assert verl.returncode == 0 and verl.stdout == planned.stdout  # the same settings in verl's keys
    pages = run("instrument", "docs")
    assert pages.returncode == 0 and "quickstart" in pages.stdout
    page = run("instrument", "docs", "quickstart")
    assert page.returncode == 0 and page.stdout.startswith("# Quick start")
    loop = run("python", "-c", _LOOP)
    assert loop.returncode == 0, loop.stderr
    assert loop.stdout.strip().splitlines()[-1] == "failures 0"
    where = run("python", "-c", "import instrument; print(instrument.__file__)").stdout.strip()
    assert where.startswith(str(venv)), where  # the venv's copy, not the checkout's


# --------------------------------------------------------------------------- the name users install (issue 32)

# `instrument[x]` or `'instrument[x]'`: the unrelated project's name with one of our extras
_OLD_NAME = re.compile(r"(?<![\w-])instrument\[")


def _named_sources() -> list[Path]:
    """Every file a user reads an install line in: the package's messages, the pages, README, pyproject."""
    return [*sorted(PACKAGE.rglob("*.py")), *sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def test_every_install_line_names_the_distribution() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == DISTRIBUTION
    assert project["scripts"] == {"instrument": "instrument.cli:main"}  # the command keeps the import's name
    assert all(DISTRIBUTION in dep for dep in project["optional-dependencies"]["dev"] if dep.startswith("instr"))
    stale = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _named_sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _OLD_NAME.search(line)
    ]
    assert stale == []
    assert f"pip install '{DISTRIBUTION}[torch,analyze,yaml]'" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_old_name_check_finds_a_planted_line() -> None:
    """The scan above must catch the old name, or it proves nothing; the new name and other words pass."""
    assert _OLD_NAME.search("needs PyYAML (pip install 'instrument[yaml]')")
    assert _OLD_NAME.search("wherever instrument[torch,yaml] is installed")
    assert not _OLD_NAME.search(f"pip install '{DISTRIBUTION}[yaml]'")
    assert not _OLD_NAME.search("header['instrument'] and metadata_instrument[0]")


def test_the_wheel_carries_the_distribution_name(wheel: Path) -> None:
    version = wheel.name.split("-")[1]
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"{WHEEL_NAME}-{version}.dist-info/METADATA").decode().splitlines()
        scripts = archive.read(f"{WHEEL_NAME}-{version}.dist-info/entry_points.txt").decode()
    assert f"Name: {DISTRIBUTION}" in metadata
    assert {f"Provides-Extra: {extra}" for extra in ("torch", "analyze", "yaml")} <= set(metadata)
    assert "instrument = instrument.cli:main" in scripts


@pytest.mark.slow  # a venv and a pip install from a local folder: ~15 s
def test_the_wheel_installs_by_its_name(wheel: Path, tmp_path: Path) -> None:
    """``pip install 'instrument-rl[torch,analyze,yaml]'`` from the wheel's folder alone (no index) into a fresh
    venv outside the checkout gives the ``instrument`` command and imports the wheel's copy.

    The extras' packages (torch, rich, ...) are this interpreter's: the venv sees them through a ``.pth``
    line naming a folder of links to its site-packages' entries, all but the editable install of this
    checkout (its metadata would tell pip the distribution is already installed, and its finder would put
    the checkout on the path), and pip (this interpreter's, ``--python``: the venv has none of its own)
    finds them installed instead of downloading them.
    """
    venv = tmp_path / "venv"
    # without its own pip and setuptools: an older setuptools of the venv's would hide the one torch needs
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=HANG_GUARD_S)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=HANG_GUARD_S,
    ).stdout.strip()
    ours = [p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "attrs").is_dir()]
    assert ours, "this interpreter has no site-packages with attrs"
    deps = tmp_path / "deps"
    deps.mkdir()
    own = DISTRIBUTION.replace("-", "_")
    for entry in ours[0].iterdir():
        if not entry.name.startswith((own, f"__editable__.{own}", f"__editable___{own}")):
            (deps / entry.name).symlink_to(entry)
    (Path(purelib) / "deps_from_the_test.pth").write_text(f"{deps}\n")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "PIP_CONFIG_FILE": "/dev/null"}
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, cwd=outside, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False
        )

    installed = run(  # this interpreter's pip, installing into the venv
        sys.executable, "-m", "pip", "--python", str(python), "install", "--disable-pip-version-check", "--no-index",
        "--find-links", str(wheel.parent), f"{DISTRIBUTION}[torch,analyze,yaml]",
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert f"Successfully installed {DISTRIBUTION}-" in installed.stdout
    command = venv / "bin" / "instrument"
    assert command.is_file()
    helped = run(str(command), "--help")
    assert helped.returncode == 0 and "instrument docs [PAGE]" in helped.stdout, helped.stderr
    page = run(str(command), "docs", "quickstart")
    assert page.returncode == 0 and page.stdout.startswith("# Quick start"), page.stderr
    where = run(
        str(python), "-c",
        "import importlib.metadata as m, instrument; print(instrument.__file__); print(m.version('instrument-rl'))",
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    file, version = where.stdout.split()
    assert Path(file).is_relative_to(venv) and not Path(file).is_relative_to(ROOT), file  # the wheel's copy
    assert version == wheel.name.split("-")[1]
