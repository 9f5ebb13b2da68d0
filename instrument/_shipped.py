"""The docs' pages and the example configurations, as installed: inside the package in a wheel
(``setup.py`` copies them there), the checkout's ``docs/`` and ``examples/`` in a source tree.

Standard library only.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["doc_page", "doc_pages", "example", "examples", "for_reading"]

_PACKAGE = Path(__file__).resolve().parent


def _folder(name: str) -> Path | None:
    inside = _PACKAGE / name
    if inside.is_dir():
        return inside
    checkout = _PACKAGE.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / name).is_dir():  # never a site-packages neighbour
        return checkout / name
    return None


def _files(folder: str, pattern: str, suffix: str) -> dict[str, Path]:
    where = _folder(folder)
    found = [] if where is None else sorted(where.glob(pattern))
    return {path.name.removesuffix(suffix): path for path in found}


def examples() -> dict[str, Path]:
    """Example configuration name (``verl_ppo``) -> its YAML file."""
    return _files("examples", "verl_*.yaml", ".yaml")  # as setup.py ships them: not the demo's own


def example(name: str) -> Path:
    """The YAML file of example ``name`` (``verl_ppo`` or ``verl_ppo.yaml``); ``ValueError`` naming the others."""
    known = examples()
    found = known.get(name.removesuffix(".yaml"))
    if found is None:
        listing = ", ".join(known) or "none are installed"
        raise ValueError(f"no example configuration {name!r} (examples: {listing})")
    return found


def doc_pages() -> dict[str, Path]:
    """Page name (``config``) -> its Markdown file."""
    return _files("docs", "*.md", ".md")


def doc_page(name: str) -> str:
    """The Markdown of page ``name`` (``config``, ``config.md`` or ``docs/config.md``), as the file holds it
    (see :func:`for_reading`); ``ValueError`` if none."""
    pages = doc_pages()
    found = pages.get(Path(name).name.removesuffix(".md"))
    if found is None:
        listing = ", ".join(pages) or "none are installed"
        raise ValueError(f"no documentation page {name!r} (pages: {listing})")
    return found.read_text(encoding="utf-8")


# A fence opens with 3+ backticks (no backtick after them, as CommonMark) or tildes; it closes with 3+ of the same.
_FENCE = re.compile(r"^ {0,3}(`{3,}(?=[^`]*$)|~{3,})")
_COMMENT_LINE = re.compile(r"^\s*<!--(?:(?!-->).)*-->\s*$")  # the docs tests' marks: <!-- not run: ... -->
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")  # ![alt](images/x.png): the wheel ships no images


def _closes(line: str, fence: str) -> bool:
    """Whether ``line`` closes the block ``fence`` opened: only the same character, at least as many."""
    body = line.strip()
    return len(body) >= len(fence) and body == fence[0] * len(body)


def for_reading(markdown: str) -> str:
    """A page as ``instrument docs`` shows it: without the test marks (lines that are one HTML comment) and
    without image links (an image alone on its line goes, one inside text leaves its alt text); fenced
    blocks stay exactly as written. A line dropped after a blank line takes the blank line after it along."""
    out: list[str] = []
    fence = ""  # the open block's fence, "" outside any
    skip_blank = False
    for line in markdown.splitlines(keepends=True):
        if fence:
            fence = "" if _closes(line, fence) else fence
            out.append(line)
            continue
        opened = _FENCE.match(line)
        if opened is None and (_COMMENT_LINE.match(line) or _IMAGE.fullmatch(line.strip())):
            skip_blank = not out or not out[-1].strip()
            continue
        if skip_blank and not line.strip():
            skip_blank = False
            continue
        skip_blank = False
        fence = opened.group(1) if opened else ""
        out.append(line if fence else _IMAGE.sub(r"\1", line))
    return "".join(out)
