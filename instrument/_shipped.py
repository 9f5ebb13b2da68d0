"""The docs' pages and the example configurations, as installed: inside the package in a wheel
(``setup.py`` copies them there), the checkout's ``docs/`` and ``examples/`` in a source tree.

Standard library only.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["doc_page", "doc_pages", "example", "examples"]

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
    """The Markdown of page ``name`` (``config``, ``config.md`` or ``docs/config.md``); ``ValueError`` if none."""
    pages = doc_pages()
    found = pages.get(Path(name).name.removesuffix(".md"))
    if found is None:
        listing = ", ".join(pages) or "none are installed"
        raise ValueError(f"no documentation page {name!r} (pages: {listing})")
    return found.read_text(encoding="utf-8")
