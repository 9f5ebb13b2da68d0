"""Opening files of a directory we do not trust: only regular files, never a wait, bounded decoding.

A ``save_path`` handed to ``instrument analyze`` may hold anything under a trace's name: a FIFO (an
``open`` that never returns), a directory, a dangling symlink or a loop, or a small gzip that
decompresses to gigabytes or nests arrays a million deep (``ijson`` keeps the path of every open
level, so its memory grows with the square of the depth). Here:

- :func:`entry_problem` says what is wrong with a listed name (``None`` for a regular file, also
  through a symlink: reading through a link is harmless, and lets users gather runs in one folder);
- :func:`open_regular` opens with ``O_NONBLOCK`` and checks ``fstat`` of what it opened, so a file
  swapped for a FIFO after listing cannot block either;
- :class:`JsonGuard` watches the decoded bytes on their way to the JSON parser and stops at
  :data:`MAX_DEPTH` levels of nesting, a string of :data:`MAX_TOKEN_BYTES` (a number or literal of
  :data:`MAX_BARE_BYTES`), or
  :func:`max_decoded_bytes` in all (:data:`MAX_DECODED_BYTES`, or ``$INSTRUMENT_ANALYZE_MAX_BYTES``).

The guard never parses: it drops escapes and strings and counts brackets with ``bytes.replace`` and
``bytes.translate`` (C loops over the whole piece, never a Python step per string), so it costs a
small fraction of the parse.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import itertools
import os
import re
import stat
from collections.abc import Iterator
from typing import BinaryIO

from instrument import _safe_files

__all__ = [
    "MAX_BYTES_ENV",
    "MAX_DECODED_BYTES",
    "MAX_DEPTH",
    "MAX_EVENT_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_BARE_BYTES",
    "MAX_TOKEN_BYTES",
    "JsonGuard",
    "NotRegularFileError",
    "OverLimitError",
    "TooLargeError",
    "TraceError",
    "entry_problem",
    "max_decoded_bytes",
    "open_json",
    "open_regular",
    "read_at_most",
    "uncompressed_size",
]

MAX_DEPTH = 512
"""Deepest JSON nesting read. Chrome traces need about 6 levels; ``ijson`` needs memory quadratic in it."""

MAX_TOKEN_BYTES = 16 << 20
"""Longest string read: the parser holds a token whole (twice), so this bounds its memory."""

MAX_EVENT_BYTES = 16 << 20
"""Largest single trace event (any value inside the top-level object's values): the streaming reader
builds one event at a time as Python objects, up to ~16x its text (``[1,1,…]``: 32 bytes per 2)."""

MAX_HEADER_BYTES = 1 << 20
"""Largest ``distributedInfo`` / ``instrument`` header object: read whole, a Python step per value
(real ones take under a kilobyte)."""

MAX_BARE_BYTES = 1 << 20
"""Longest number or literal read (yajl re-reads an unfinished one from its start at every buffer:
time quadratic in its length). Real ones have at most a few dozen characters."""

MAX_DECODED_BYTES = 1 << 30
"""Most bytes one file may decompress to (1 GiB): bounds the time of a scan and its memory, which for a
file of nothing but tiny events is a few times this (real traces: a small fraction). A real trace
that is larger: set ``$INSTRUMENT_ANALYZE_MAX_BYTES``."""

MAX_BYTES_ENV = "INSTRUMENT_ANALYZE_MAX_BYTES"

_GZIP_MAGIC = b"\x1f\x8b"
_SLICE = 1 << 20  # the guard looks at most this much at once, so a string inside one look stays small
_EVENT_LEVEL = 2  # the top-level object is level 1, traceEvents level 2: its items are the events
_ARRAY_EVENT_LEVEL = 1  # the array form: the top-level array is level 1, its items are the events


class TraceError(Exception):
    """A file that cannot be read as a chrome trace; the message is the reason."""


class NotRegularFileError(TraceError):
    """The path is a FIFO, a directory, a device or a socket (the message says which)."""


class OverLimitError(TraceError):
    """The decoded text passed one of the limits (the message names it)."""


def max_decoded_bytes() -> int:
    """:data:`MAX_DECODED_BYTES`, or ``$INSTRUMENT_ANALYZE_MAX_BYTES``; ``ValueError`` naming a bad value."""
    text = os.environ.get(MAX_BYTES_ENV)
    if text is None or not text.strip():
        return MAX_DECODED_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{MAX_BYTES_ENV} must be a whole number of bytes > 0 (got {text!r})")
    return value


def entry_problem(path: str) -> str | None:
    """Why ``path`` (a directory entry) cannot be read as a file; ``None`` for a regular file."""
    try:
        st = os.stat(path)  # follows a symlink: its target is what would be read
    except OSError as exc:
        return _open_failure(path, exc)
    if stat.S_ISREG(st.st_mode):
        return None
    link = " (through a symlink)" if os.path.islink(path) else ""
    return f"not a regular file: {_safe_files.kind_of(st.st_mode)}{link}"


def _open_failure(path: str, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symlink loop (too many levels of symbolic links)"
    if exc.errno == errno.ENOENT and os.path.islink(path):
        return f"dangling symlink (its target {os.readlink(path)} does not exist)"
    return f"cannot read ({exc.strerror or exc})"


def open_regular(path: str) -> BinaryIO:
    """``path`` opened for binary reading, only when it is a regular file (checked on what was opened).

    ``O_NONBLOCK`` makes opening a FIFO return at once instead of waiting for a writer; the check
    then refuses it. Raises :class:`NotRegularFileError`, :class:`TraceError` for a dangling symlink or a
    loop, or ``OSError``.
    """
    try:
        return _safe_files.open_regular(path, follow_symlinks=True)
    except _safe_files.NotRegularFileError as exc:
        raise NotRegularFileError(f"not a regular file: {_safe_files.kind_of(exc.mode)}") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT) and os.path.islink(path):
            raise TraceError(_open_failure(path, exc)) from exc
        raise


def uncompressed_size(path: str) -> int:
    """The size of the decoded text (gzip's ISIZE trailer, modulo 4 GiB), or the file's size.

    Only a hint for choosing a reader: a forged trailer can say anything, so readers never trust it
    for memory (see :func:`read_at_most`).
    """
    with open_regular(path) as raw:
        size = os.fstat(raw.fileno()).st_size
        if raw.read(2) != _GZIP_MAGIC or size < 18:
            return size
        raw.seek(-4, os.SEEK_END)
        isize = int.from_bytes(raw.read(4), "little")
        return max(isize, size)  # ISIZE wraps at 4 GiB: never trust it below the compressed size


@contextlib.contextmanager
def open_json(path: str, max_bytes: int | None = None) -> Iterator[GuardedReader]:
    """The file's text as guarded bytes: gunzipped when it starts with gzip's magic, whatever its name."""
    limit = max_decoded_bytes() if max_bytes is None else max_bytes
    with open_regular(path) as raw:
        magic = raw.read(2)
        raw.seek(0)
        if magic == _GZIP_MAGIC:
            with gzip.GzipFile(fileobj=raw, mode="rb") as packed:
                yield GuardedReader(packed, JsonGuard(max_bytes=limit))
        else:
            yield GuardedReader(raw, JsonGuard(max_bytes=limit))


class TooLargeError(Exception):
    """More bytes than :func:`read_at_most` was asked to take."""


def read_at_most(stream: GuardedReader | BinaryIO, limit: int) -> bytes:
    """All of ``stream``; :class:`TooLargeError` once it passes ``limit`` bytes (nothing more is read)."""
    parts: list[bytes] = []
    held = 0
    while held <= limit:
        part = stream.read(min(_SLICE, limit + 1 - held))
        if not part:
            return b"".join(parts)
        parts.append(part)
        held += len(part)
    raise TooLargeError(f"more than {limit:,} bytes")


class GuardedReader:
    """A binary stream whose every byte goes through a :class:`JsonGuard` before the caller sees it."""

    def __init__(self, inner: BinaryIO | io.BufferedIOBase, guard: JsonGuard) -> None:
        self._inner = inner
        self.guard = guard

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes (all, in guarded slices, when negative); raises :class:`OverLimitError`."""
        if size is None or size < 0:
            parts = []
            while part := self.read(_SLICE):
                parts.append(part)
            return b"".join(parts)
        data = self._inner.read(size)
        self.guard.feed(data)
        return data

    def readable(self) -> bool:
        return True


_KEEP = bytes.maketrans(b"{}", b"[]")  # curly and square brackets nest alike
_DROP = bytes(sorted(set(range(256)) - set(b'"[]{}')))
_QUOTED = re.compile(rb'"[^"]*"?')  # on text reduced to quotes and brackets: a string, or one cut off
_BARE = b"0123456789+-.eEtruefalsn"  # what numbers and literals are made of


def _odd_backslashes(data: bytes) -> bool:
    """Whether ``data`` ends with an unpaired backslash (the next byte is escaped)."""
    return (len(data) - len(data.rstrip(b"\\"))) % 2 == 1


class JsonGuard:
    """Follows nesting depth, the current token's length and the byte count of a JSON text fed in pieces.

    Exact for valid JSON (strings, escapes, pieces cut anywhere), token lengths to within a piece; on
    invalid text it may count wrong, which only matters for a file the parser refuses anyway. Raises
    :class:`OverLimitError` naming the limit as soon as a piece passes one.
    """

    def __init__(
        self,
        *,
        max_bytes: int,
        max_depth: int = MAX_DEPTH,
        max_token: int = MAX_TOKEN_BYTES,
        max_bare: int = MAX_BARE_BYTES,
        max_event: int = MAX_EVENT_BYTES,
    ) -> None:
        self.max_bytes, self.max_depth, self.max_token, self.max_bare = max_bytes, max_depth, max_token, max_bare
        self.max_event = max_event
        self.total = 0
        self.depth = 0
        self.in_string = False
        self._escaped = False  # in a string, and the piece ended with an unpaired backslash
        self._token = 0  # bytes of the string or bare token still open at the end of the last piece
        self._event = 0  # bytes since the text was last at most _EVENT_LEVEL deep (within a piece)
        self._level = 0  # _EVENT_LEVEL, or _ARRAY_EVENT_LEVEL for the array form; 0 until the first byte

    def feed(self, data: bytes) -> None:
        """Look at the next decoded bytes."""
        if len(data) <= _SLICE:
            self._feed(data)
            return
        view = memoryview(data)
        for start in range(0, len(data), _SLICE):
            self._feed(bytes(view[start : start + _SLICE]))

    def _feed(self, data: bytes) -> None:
        self.total += len(data)
        if self.total > self.max_bytes:
            raise OverLimitError(
                f"over the size limit: more than {self.max_bytes:,} bytes when decompressed "
                f"(raise it with {MAX_BYTES_ENV})"
            )
        if self._escaped:  # the first byte is escaped by the last piece's backslash
            data, self._escaped = data[1:], False
        if not data:
            return
        if not self._level and data.strip():
            self._level = _ARRAY_EVENT_LEVEL if data.lstrip()[:1] == b"[" else _EVENT_LEVEL
        # Escapes first, as a parser meets them from the left: `\\` pairs, then `\"`; what is left of
        # the strings are plain quotes. Strings become the text between quotes 2k and 2k+1, and the
        # text is cut down to quotes and brackets (in C: translate, replace).
        text = data.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in data else data
        kept = (b'"' if self.in_string else b"") + text.translate(_KEEP, _DROP)
        # Dropping two adjacent quotes keeps the parity of all others: strings without brackets go.
        kept = kept.replace(b'""', b"")
        started_in_string = self.in_string
        if b'"' in kept:  # a string with a bracket inside, or one the piece cuts off (rare, small)
            self.in_string = kept.count(b'"') % 2 == 1
            kept = _QUOTED.sub(b"", kept)
        else:
            self.in_string = False
        if self.in_string:
            self._escaped = _odd_backslashes(data)
            if started_in_string and b'"' not in text:
                self._grow(len(data))  # the whole piece is inside one string
            else:
                self._restart(len(data) - data.rfind(b'"'))
        else:
            bare = len(data) - len(data.rstrip(_BARE))
            if bare == len(data) and not started_in_string:
                self._grow(bare, bare=True)  # no separator at all: the number or literal goes on
            else:
                self._restart(bare, bare=True)
        self._nest(kept, len(data))

    def _grow(self, count: int, *, bare: bool = False) -> None:
        self._token += count
        if bare and self._token > self.max_bare:
            raise OverLimitError(f"over the token limit: a number or literal longer than {self.max_bare:,} bytes")
        if self._token > self.max_token:
            raise OverLimitError(f"over the token limit: a string longer than {self.max_token:,} bytes")

    def _restart(self, count: int, *, bare: bool = False) -> None:
        self._token = 0
        self._grow(count, bare=bare)

    def _nest(self, brackets: bytes, size: int) -> None:
        # Removing adjacent pairs until none is left takes one pass per level of the deepest closed
        # group and leaves `]]..[[`: what closes levels open before, and what stays open.
        reduced, passes = brackets, 0
        while b"[]" in reduced:
            reduced = reduced.replace(b"[]", b"")
            passes += 1
            if passes > self.max_depth:  # a closed group this deep is too deep wherever it sits
                self._too_deep()
        closes = reduced.count(b"]")
        # The residual closes reach the lowest level of the piece: at or under _EVENT_LEVEL, an event
        # (an item of traceEvents) ended here; otherwise the one open goes on.
        self._event = 0 if self.depth - closes <= (self._level or _EVENT_LEVEL) else self._event + size
        if self._event > self.max_event:
            raise OverLimitError(f"over the event limit: one event larger than {self.max_event:,} bytes")
        after = max(self.depth - closes, 0) + len(reduced) - closes
        # No closed group sits higher than the start or end level of the piece: a cheap upper bound.
        # Only past the limit is the exact peak counted (a Python step per bracket).
        if max(self.depth, after) + passes > self.max_depth and self._peak(brackets) > self.max_depth:
            self._too_deep()
        self.depth = after

    def _peak(self, brackets: bytes) -> int:
        # `[` is byte 91 and `]` 93: 92 - byte is the step up or down
        return max(itertools.accumulate((92 - b for b in brackets), initial=self.depth))

    def _too_deep(self) -> None:
        raise OverLimitError(f"over the nesting limit: JSON nested deeper than {self.max_depth} levels")
