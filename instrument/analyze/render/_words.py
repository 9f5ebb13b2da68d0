"""How the report writes numbers and counts (shared by the table, the page and the picture)."""

from __future__ import annotations

__all__ = ["ms", "pct", "plural", "size"]


def ms(value: float | None) -> str:
    """Milliseconds as the tables write them: two decimals under 10 (``3.83``), else one (``1,234.5``); ``-``: none."""
    if value is None:
        return "-"
    return f"{value:,.2f}" if value < 10 else f"{value:,.1f}"


def size(count: int) -> str:
    """Bytes in kB or MB (decimal): ``12.3 kB``, ``4.5 MB``."""
    return f"{count / 1e6:,.1f} MB" if count >= 100_000 else f"{count / 1e3:,.1f} kB"  # not "0.0 MB"


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 rank``, ``2 ranks``, ``1,024 processes`` (``many``: an irregular plural)."""
    return f"{count:,} {word if count == 1 else many or word + 's'}"


def pct(part: float, whole: float) -> str:
    """``part`` as a percentage of ``whole``: ``17.2%``; ``-`` when ``whole`` is 0."""
    return f"{100.0 * part / whole:.1f}%" if whole > 0 else "-"
