"""Every documented path runs as written: the code blocks of README.md and docs/*.md, executed.

How a page's fenced blocks are taken (the rules docs/architecture.md's "Testing the docs" repeats):

- ```` ```python ```` blocks of a page run together, in page order, as one program in a fresh
  ``.venv`` interpreter, in a temporary folder of their own; later blocks see what earlier ones
  defined. A block whose first line starts with ``>>>`` is a session: each ``>>> statement`` runs and
  the lines below it are what it must print (``repr``), or ``Error: message`` it must raise, exactly.
- ```` ```console ````, ```` ```sh ````, ```` ```bash ```` and ```` ```shell ```` blocks are commands,
  run by ``/bin/sh`` in the same folder after the page's program, in page order, each expected to
  exit 0, with the ``.venv``'s ``bin`` first on ``PATH`` (``python`` and ``instrument`` are the
  project's). In a console block the commands are the ``$ `` lines (a trailing ``\\`` continues one),
  the rest is output and not compared; a console block without ``$`` lines is all commands. In the
  others every line but blanks and ``#`` comments is a command.
- Any other info string (``text``, ``json``, ``toml``, ``promql``, none) is never run: output
  samples and formats are ```` ```text ````.
- An HTML comment on the last non-blank line before a fence changes that: ``<!-- not run: REASON -->``
  leaves the block out (a fragment, a GPU, nsys, a vLLM server, a Ray cluster, the network; the reason
  is required and is the reviewable part); ``<!-- run: WORDS -->`` runs it with ``fresh`` (a Python
  block starts a new program, and the blocks after it join that one), ``exit=N`` (commands expected to
  exit N) or ``slow`` (the page's test is marked slow).
- The placeholders the pages name are real files the test makes first, in every page's folder:
  ``outputs/profile`` (a profiled run of 4 ranks, steps 1-4, made once per session by a real
  torch.profiler), copies of it at ``outputs/last-week/profile``, ``base/profile`` and
  ``cand/profile``, ``base.json`` / ``cand.json`` (``instrument analyze --json`` of it),
  ``profile.yaml`` (a valid configuration), ``broken.yaml`` (an invalid one) and ``examples/`` (the
  repository's, linked).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNS_PYTHON = {"python", "py"}
RUNS_SHELL = {"console", "sh", "bash", "shell"}
HANG_GUARD_S = 300  # only against a hang: the assertions are about exit status and output

# As CommonMark: a backtick fence's info string holds no backtick (```` ```x ```` at a line's start is inline code).
_FENCE = re.compile(r"^(\s*)(`{3,}(?=[^`]*$)|~{3,})\s*([^\s`{]*)")
_MARK = re.compile(r"^\s*<!--\s*(not run|run)\s*:\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    """One fenced block of a page, with the mark before it."""

    page: Path
    line: int
    lang: str
    text: str
    skip: str | None = None
    words: set[str] = field(default_factory=set)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def expected_exit(self) -> int:
        codes = [int(w.split("=", 1)[1]) for w in self.words if w.startswith("exit=")]
        return codes[0] if codes else 0


def blocks_of(page: Path, text: str | None = None) -> list[Block]:
    """The fenced blocks of ``page`` (or of ``text``, said to be its), nested fences (in a list) included."""
    lines = (page.read_text(encoding="utf-8") if text is None else text).splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = match.groups()
        end = i + 1
        while end < len(lines) and not re.fullmatch(rf"{re.escape(fence[0])}{{{len(fence)},}}", lines[end].strip()):
            end += 1
        body = textwrap.dedent(
            "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end])
        )
        block = Block(page, i + 1, lang.lower(), body)
        before = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        mark = _MARK.match(before)
        if mark:
            kind, rest = mark.groups()
            if kind == "not run":
                assert rest, f"{block.where}: '<!-- not run: REASON -->' needs its reason"
                block.skip = rest
            else:
                block.words = set(rest.split())
        found.append(block)
        i = end + 1
    return found


def runnable(block: Block) -> bool:
    return block.skip is None and block.lang in RUNS_PYTHON | RUNS_SHELL


def commands_of(block: Block) -> list[str]:
    """The commands of a shell block, continuation lines joined."""
    lines = block.text.splitlines()
    prompted = block.lang == "console" and any(line.startswith("$ ") for line in lines)
    commands: list[str] = []
    current: list[str] | None = None
    for line in lines:
        if current is not None:  # a continued command
            current.append(line)
        elif prompted:
            if not line.startswith("$ "):
                continue
            current = [line[2:]]
        else:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            current = [line]
        if not current[-1].rstrip().endswith("\\"):
            commands.append("\n".join(current))
            current = None
    if current is not None:
        commands.append("\n".join(current))
    return commands


def session_program(block: Block) -> str:
    """A ``>>>`` block as Python: each statement checked against the lines under it."""
    out: list[str] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.startswith(">>> "):
            continue
        source = line[4:]
        expected: list[str] = []
        while i < len(lines) and not lines[i].startswith(">>> "):
            expected.append(lines[i])
            i += 1
        out.append(f"_doc_check({source!r}, {chr(10).join(expected)!r}, {block.where!r})")
    return "\n".join(out)


_PRELUDE = """
def _doc_check(source, expected, where):
    import traceback
    try:
        try:
            code = compile(source, where, "eval")
        except SyntaxError:
            exec(compile(source, where, "exec"), globals())
            got = ""
        else:
            value = eval(code, globals())
            got = "" if value is None else repr(value)
    except Exception as exc:
        got = f"{type(exc).__name__}: {exc}"
    if got != expected.strip():
        raise AssertionError(f"{where}: >>> {source}\\n  documented: {expected.strip()!r}\\n  got:        {got!r}")
"""


def programs_of(blocks: list[Block]) -> list[tuple[str, str]]:
    """The page's Python programs: ``(where it starts, source)``; ``fresh`` starts a new one."""
    programs: list[tuple[str, list[str]]] = []
    for block in blocks:
        if not runnable(block) or block.lang not in RUNS_PYTHON:
            continue
        if not programs or "fresh" in block.words:
            programs.append((block.where, [_PRELUDE]))
        source = session_program(block) if block.text.lstrip().startswith(">>>") else block.text
        programs[-1][1].append(f"# --- {block.where}\n{source}")
    return [(where, "\n\n".join(parts)) for where, parts in programs]


# --------------------------------------------------------------------------- the folder every page runs in

_CORPUS = """
import sys
import instrument as ins
import instrument.testing

save_path = sys.argv[1]
for rank in range(4):
    instrument.testing.reset()  # one process plays each rank in turn: a run of its own each
    cfg = ins.ProfilerConfig(steps=None, all_ranks=True, contents=("cpu",), save_path=save_path,
                             schedule=ins.Schedule(active=2, repeat=2))
    ins.configure(cfg, role="actor", rank=rank, world_size=4)

    @ins.profiled_stage("generate_sequences")
    def generate_sequences():
        return sum(range(20_000 * (2 if rank == 3 else 1)))   # rank 3 is the straggler

    @ins.profiled_stage("update_actor", scheduled=True)
    def update_actor():
        for i in range(4):
            with ins.profile_window(mini_batch=i):
                sum(range(5_000))

    for step in range(1, 5):
        with ins.profile_step(step):
            generate_sequences()
            update_actor()
    ins.finish()
"""

PROFILE_YAML = """\
steps: [2, 4]
ranks: [0]
save_path: outputs/profile
schedule:
  warmup: 1
  active: 2
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("INSTRUMENT_KINETO_LOGS", None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real profiled run (4 ranks, steps 1-4) and ``instrument analyze --json`` of it, made once."""
    where = tmp_path_factory.mktemp("docs-corpus")
    profile = where / "profile"
    subprocess.run([sys.executable, "-c", _CORPUS, str(profile)], check=True, timeout=HANG_GUARD_S, env=_env())
    with open(where / "analysis.json", "w", encoding="utf-8") as out:
        subprocess.run(
            [sys.executable, "-m", "instrument", "analyze", str(profile), "--json"],
            stdout=out,
            check=True,
            timeout=HANG_GUARD_S,
            env=_env(),
        )
    return where


def _folder(tmp_path: Path, corpus: Path) -> Path:
    for target in ("outputs/profile", "outputs/last-week/profile", "base/profile", "cand/profile"):
        shutil.copytree(corpus / "profile", tmp_path / target)
    for name in ("base.json", "cand.json"):
        shutil.copy(corpus / "analysis.json", tmp_path / name)
    (tmp_path / "profile.yaml").write_text(PROFILE_YAML, encoding="utf-8")
    (tmp_path / "broken.yaml").write_text("steps: [1, 2\nranks: [0]\n", encoding="utf-8")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return tmp_path


def _page_param(page: Path) -> object:
    blocks = blocks_of(page)
    slow = any("slow" in b.words for b in blocks if runnable(b))
    return pytest.param(page, id=str(page.relative_to(ROOT)), marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES])
def test_the_page_runs_as_written(page: Path, tmp_path: Path, corpus: Path) -> None:
    blocks = blocks_of(page)
    if not any(runnable(b) for b in blocks):
        pytest.skip(f"{page.name}: no block meant to run")
    folder = _folder(tmp_path, corpus)
    env = _env()
    for where, source in programs_of(blocks):
        done = subprocess.run(
            [sys.executable, "-c", source],
            check=False,
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
        assert done.returncode == 0, f"{where}: the page's Python failed\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        assert "USDT:" not in done.stderr, f"{where}: kineto's lines reached stderr"
    for block in blocks:
        if not runnable(block) or block.lang not in RUNS_SHELL:
            continue
        for command in commands_of(block):
            done = subprocess.run(
                ["/bin/sh", "-c", command],
                check=False,
                cwd=folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=HANG_GUARD_S,
            )
            assert done.returncode == block.expected_exit, (
                f"{block.where}: `{command}` exited {done.returncode}, not {block.expected_exit}\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )


def test_every_mark_is_read_and_every_block_is_classified() -> None:
    """A mark that is misspelt would silently run or skip a block: every ``<!-- … run … -->`` parses,
    and no block in a language that runs hides an unknown ``run:`` word."""
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            if re.match(r"^\s*<!--.*\brun\b", line) and "not run" not in line:
                assert _MARK.match(line), f"{page.name}:{number}: unreadable mark {line!r}"
        for block in blocks_of(page):
            unknown = {w for w in block.words if w not in ("fresh", "slow") and not re.fullmatch(r"exit=\d+", w)}
            assert not unknown, f"{block.where}: unknown run words {unknown}"


def test_the_rules_find_what_they_should() -> None:
    """The extraction itself, on a page written here: marks, sessions, prompts and continuations."""
    page = ROOT / "docs" / "probe.md"  # never written: the text below stands for it
    text = textwrap.dedent(
        """\
        ```console
        $ instrument plan --num-steps 2 \\
            --world-size 4
        tool torch
        ```
        <!-- not run: needs a GPU -->
        ```python
        import torch; torch.cuda.init()
        ```

        <!-- run: fresh exit=2 -->
        ```bash
        # a comment
        instrument plan --config broken.yaml
        ```
        ```` ```python ```` in prose is no fence
        - a list item:
          ```python
          >>> 1 + 1
          2
          ```
        """
    )
    blocks = blocks_of(page, text)
    assert [(b.lang, b.skip, b.words) for b in blocks] == [
        ("console", None, set()),
        ("python", "needs a GPU", set()),
        ("bash", None, {"fresh", "exit=2"}),
        ("python", None, set()),
    ]
    assert commands_of(blocks[0]) == ["instrument plan --num-steps 2 \\\n    --world-size 4"]
    assert commands_of(blocks[2]) == ["instrument plan --config broken.yaml"] and blocks[2].expected_exit == 2
    assert "_doc_check('1 + 1', '2'" in session_program(blocks[3])
