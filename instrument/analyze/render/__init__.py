"""Showing a :class:`~instrument.analyze.Report`: the terminal table, the picture and the page.

>>> from instrument.analyze import analyze, render_text, write_html, write_png
>>> report = analyze("outputs/profile")                       # doctest: +SKIP
>>> print(render_text(report)); write_png(report, "a.png"); write_html(report, "a.html")  # doctest: +SKIP

A renderer takes a result and gives text or a file; the result knows nothing of its renderers.
``rich`` (the table; plain text without it) and ``matplotlib`` (the picture, and so the page) are
imported when called. Files are written whole, never through a symlink or into a FIFO: a refused
destination raises :class:`UnsafeDestinationError` (an ``OSError``).
"""

from __future__ import annotations

from instrument.analyze.render._destination import UnsafeDestinationError
from instrument.analyze.render._html import write_html
from instrument.analyze.render._png import write_png
from instrument.analyze.render._text import render_text

__all__ = ["UnsafeDestinationError", "render_text", "write_html", "write_png"]
