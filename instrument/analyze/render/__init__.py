"""Showing a :class:`~instrument.analyze.Report`: the terminal table, the picture, the page and the merged trace.

>>> from instrument.analyze import analyze, render_text, write_html, write_png
>>> from instrument.analyze.render import write_merged_trace
>>> report = analyze("outputs/profile")                       # doctest: +SKIP
>>> print(render_text(report)); write_png(report, "a.png"); write_html(report, "a.html")  # doctest: +SKIP
>>> write_merged_trace(report, "merged.json.gz")  # every rank's timeline, for Perfetto  # doctest: +SKIP

A renderer takes a result and gives text or a file; the result knows nothing of its renderers.
``rich`` (the table; plain text without it), ``matplotlib`` (the picture, and so the page) and
``plotly`` (the page's interactive timeline; a note instead without it) are imported when called.
Files are written whole, never through a symlink or into a FIFO: a refused destination raises
:class:`UnsafeDestinationError` (an ``OSError``).
"""

from __future__ import annotations

from instrument.analyze.render._destination import UnsafeDestinationError
from instrument.analyze.render._html import write_html
from instrument.analyze.render._merged import write_merged_trace
from instrument.analyze.render._png import write_png
from instrument.analyze.render._text import render_text

__all__ = ["UnsafeDestinationError", "render_text", "write_html", "write_merged_trace", "write_png"]
