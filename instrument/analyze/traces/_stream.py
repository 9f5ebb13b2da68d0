"""A chrome trace's events decoded one at a time by the standard library's C JSON scanner.

``ijson`` builds every event through its own callbacks; ``json``'s C scanner builds the same dicts
about 1.5x faster, and that decoding is nearly all the time ``instrument analyze`` spends. Here the
scanner runs event by event over text read a piece at a time, so memory stays bounded by a piece
and the largest event, as with ``ijson``.

Both forms of the Chrome trace format are followed: one object whose ``traceEvents`` member (once) is
an array, the other members read and dropped; or the events as a bare array, whose closing ``]`` may
be missing (after a trailing comma too), as the format allows a writer that stopped abruptly.
Anything else (invalid JSON or text, ``NaN``, a second ``traceEvents``, a member or event larger
than :data:`MAX_PENDING`) raises :class:`UnfollowedError` and the caller reads the file again with
``ijson``, which decides and words the error as before. What the stream raises itself (the guard's
limits, I/O and gzip errors) passes through.

Standard library only.
"""

from __future__ import annotations

import codecs
import json
import json.scanner
import re
from collections.abc import Iterator
from typing import Any, Protocol

__all__ = ["MAX_PENDING", "PIECE", "UnfollowedError", "events"]

PIECE = 1 << 20
"""Bytes read at a time."""
MAX_PENDING = 17 << 20
"""Most text held for one unfinished value: the guard's event limit (16 MiB) and a piece."""

_WS = re.compile(r"[ \t\n\r]*")
_COMMA = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")
_DONE = re.compile(r"[ \t\n\r]*\Z")
_NUMBER = frozenset("0123456789+-.eE")


class UnfollowedError(Exception):
    """Text this reader does not follow; read the file with ``ijson`` instead."""


class _ConstantError(ValueError):
    """``NaN`` or ``Infinity``: not JSON, and refused by ``ijson``."""


def _refuse_constant(name: str) -> Any:
    raise _ConstantError(name)


class _Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


class _Text:
    """Decoded text with a cursor; :meth:`more` appends the next piece and drops what was read."""

    def __init__(self, stream: _Readable) -> None:
        self.stream = stream
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.text = ""
        self.at = 0
        self.eof = False

    def more(self, at_least: int = 0) -> None:
        """Read a piece, or more up to ``at_least`` bytes (``UnfollowedError`` at the end of the file,
        or past :data:`MAX_PENDING` held)."""
        if self.eof:
            raise UnfollowedError("the text ends early")
        kept = self.text[self.at :]
        if len(kept) > MAX_PENDING:
            raise UnfollowedError("a value larger than the reader holds")
        parts, added = [kept], 0
        while True:
            piece = self.stream.read(PIECE)
            self.eof = not piece
            try:
                parts.append(self.decoder.decode(piece, final=self.eof))
            except UnicodeDecodeError as exc:
                raise UnfollowedError("not UTF-8") from exc
            added += len(piece)
            if self.eof or added >= at_least:
                break
        self.text, self.at = "".join(parts), 0

    def char(self) -> str:
        """The next character after white space, without taking it; ``""`` at the end of the file."""
        while True:
            self.at = _WS.match(self.text, self.at).end()  # type: ignore[union-attr]  # matches anywhere
            if self.at < len(self.text):
                return self.text[self.at]
            if self.eof:
                return ""
            self.more()

    def expect(self, char: str) -> None:
        """Step over ``char``; :class:`UnfollowedError` when the text holds another."""
        if self.char() != char:
            raise UnfollowedError(f"expected {char!r}")
        self.at += 1


def events(stream: _Readable) -> Iterator[Any]:
    """Each item of the top-level ``traceEvents`` array (or of the top-level array), in order;
    :class:`UnfollowedError` where not followed."""
    make: Any = json.scanner.make_scanner  # the C scanner: scan(text, at) -> (value, end)
    scan = make(json.JSONDecoder(parse_constant=_refuse_constant))
    text = _Text(stream)
    if text.char() == "[":
        yield from _array(text, scan, open_end=True)
        _only_space(text)
        return
    text.expect("{")
    seen = False
    if text.char() == "}":
        raise UnfollowedError("no traceEvents")
    while True:
        key = _value(text, scan)
        if not isinstance(key, str):
            raise UnfollowedError("a member name that is no string")
        text.expect(":")
        if key == "traceEvents":
            if seen:
                raise UnfollowedError("traceEvents twice")  # ijson reads both; so does the fallback
            seen = True
            yield from _array(text, scan)
        else:
            _value(text, scan)
        char = text.char()
        text.at += 1
        if char == "}":
            break
        if char != ",":
            raise UnfollowedError("expected ',' or '}'")
    if not seen:
        raise UnfollowedError("no traceEvents")
    _only_space(text)


def _only_space(text: _Text) -> None:
    """Only white space may follow the object or array, to the end of the file (not just of this piece)."""
    while True:
        if not _DONE.match(text.text, text.at):
            raise UnfollowedError("text after the object")
        if text.eof:
            return
        text.at = len(text.text)
        text.more()


def _value(text: _Text, scan: Any) -> Any:
    """One value (of any size up to :data:`MAX_PENDING`), read on until it is whole."""
    text.char()
    while True:
        try:
            value, end = scan(text.text, text.at)
        except _ConstantError as exc:
            raise UnfollowedError("NaN or Infinity") from exc
        except RecursionError as exc:  # nested deeper than the C scanner goes (ijson goes as deep as the guard lets)
            raise UnfollowedError("nested too deep for the scanner") from exc
        except (StopIteration, ValueError):  # cut off by the end of the text read so far, or invalid
            text.more(max(PIECE, len(text.text) - text.at))  # doubling: each value is re-scanned a few times at most
            continue
        if _cut(value, text, end):
            text.more()
            continue
        text.at = end
        return value


def _cut(value: Any, text: _Text, end: int) -> bool:
    """Whether a number scanned may go on in the next piece (``1`` of ``12``, ``2`` of ``2.5``)."""
    if text.eof or not isinstance(value, int | float) or isinstance(value, bool):
        return False  # objects, arrays, strings and literals end themselves
    return end == len(text.text) or text.text[end] in _NUMBER


def _array(text: _Text, scan: Any, open_end: bool = False) -> Iterator[Any]:
    """The array's items; ``open_end``: the text may end where the next item or the ``]`` would be."""
    text.expect("[")
    first = text.char()
    if first == "]" or (open_end and not first):
        text.at += 1
        return
    while True:
        # The hot loop: one scanner call per event; refilling only at the end of a piece.
        try:
            value, end = scan(text.text, text.at)
        except _ConstantError as exc:
            raise UnfollowedError("NaN or Infinity") from exc
        except (StopIteration, ValueError, RecursionError):
            if open_end and not text.char():  # the array ends with the text (after a comma, too)
                return
            value = _value(text, scan)
        else:
            if type(value) is not dict and _cut(value, text, end):
                value = _value(text, scan)
            else:
                text.at = end
        yield value
        comma = _COMMA.match(text.text, text.at)
        if comma is not None:
            text.at = comma.end()
            continue
        char = text.char()
        text.at += 1
        if char == "]" or (open_end and not char):
            return
        if char != ",":
            raise UnfollowedError("expected ',' or ']'")
