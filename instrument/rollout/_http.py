"""One HTTP exchange with an overall deadline: the request and its whole answer, or a clear error.

Socket timeouts apply to each read, so a peer that sends its headers and then one byte a second
never trips them (urllib's ``timeout=`` kept callers waiting for minutes). Here every connect,
send and read gets only the time left until one deadline, so the exchange ends by it whatever the
peer does; no helper thread is involved, so nothing is left blocked behind. Answers are bounded in
size, redirects are never followed and proxy variables are ignored (engines and routers are
reached directly). Every failure is an :class:`HttpError` (an ``OSError``) whose message names the
request and what went wrong: "timed out after N s", "did not answer HTTP", a short body, ...
One limit remains: resolving a host name is the system resolver's (bounded by its own timeouts).
"""

from __future__ import annotations

import functools
import http.client
import io
import json
import math
import socket
import ssl
import time
import urllib.parse
from typing import Any

__all__ = ["DEFAULT_MAX_BYTES", "HttpError", "HttpTimeoutError", "check_http_url", "check_timeout", "request"]

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
"""Largest answer read (vLLM's ``/openapi.json`` is well under 1 MiB)."""

_CHUNK = 64 * 1024


class HttpError(OSError):
    """An HTTP exchange failed; the message names the request and the reason."""


class HttpTimeoutError(HttpError, TimeoutError):
    """An HTTP exchange did not complete by its deadline."""


def check_http_url(url: str, what: str = "engine URL") -> str:
    """``url`` without a trailing slash, or ``ValueError`` for anything but http(s)://host[:port].

    ``what`` names the URL in the message (``"router URL"``, ``"worker URL"``); a URL without a
    scheme gets the likely fix (``http://`` in front).
    """
    if not isinstance(url, str):
        raise TypeError(f"{what} must be a string http(s)://host:port: {url!r}")
    parsed = urllib.parse.urlsplit(url)
    try:
        parsed.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        parsed = parsed._replace(netloc="")
    if parsed.scheme not in ("http", "https") or not parsed.hostname or any(c <= " " or c == "\x7f" for c in url):
        hint = ""
        if "://" not in url and url and not any(c <= " " or c == "\x7f" for c in url):
            hint = f" (no scheme: did you mean 'http://{url}'?)"
        raise ValueError(f"{what} must be http(s)://host:port: {url!r}{hint}")
    return url.rstrip("/")


def check_timeout(value: float, field: str = "timeout_s") -> float:
    """``value`` as float seconds; ``TypeError`` / ``ValueError`` naming ``field`` unless finite and > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"'{field}' must be a number of seconds > 0: {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"'{field}' must be a finite number of seconds > 0: {value!r}")
    return float(value)


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left; ``TimeoutError`` once none is (the caller words the message)."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return left


class _DeadlineReader(io.RawIOBase):
    """The socket's receiving side, each read given only the time left (a drip cannot renew it)."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(self._deadline.left())
        return self._sock.recv_into(buffer)


class _DeadlineSocket:
    """What ``http.client`` uses of a socket (``sendall``, ``makefile``, ``close``), under one deadline.

    ``close`` is left to :func:`request`, which closes the real socket once, when the exchange ends
    (``http.client`` closes the connection's socket before the body has been read).
    """

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self._sock = sock
        self._deadline = deadline

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(self._deadline.left())  # sendall's timeout covers the whole send
        self._sock.sendall(data)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def close(self) -> None:
        pass


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


class _Connection(http.client.HTTPConnection):
    """An HTTP(S) connection whose connect and TLS handshake also run under the deadline."""

    def __init__(self, host: str, port: int, *, tls: bool, deadline: _Deadline) -> None:
        super().__init__(host, port)
        self._tls = tls
        self._deadline = deadline
        self.raw: socket.socket | None = None

    def connect(self) -> None:
        try:
            addresses = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise _UnreachableError(f"cannot resolve {self.host}: {exc}") from None
        error: OSError | None = None
        for family, kind, proto, _, address in addresses:  # each address only gets the time left
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(self._deadline.left())
                sock.connect(address)
            except TimeoutError:
                sock.close()
                raise
            except OSError as exc:
                sock.close()
                error = exc
                continue
            self.raw = sock
            break
        if self.raw is None:
            raise _UnreachableError(f"cannot connect to {self.host}:{self.port}: {error}")
        if self._tls:
            self.raw.settimeout(self._deadline.left())  # the handshake's reads share one deadline in _ssl
            self.raw = _tls_context().wrap_socket(self.raw, server_hostname=self.host)
        self.sock = _DeadlineSocket(self.raw, self._deadline)

    def close_all(self) -> None:
        self.close()
        if self.raw is not None:
            self.raw.close()


class _UnreachableError(OSError):
    pass


def _read_body(response: http.client.HTTPResponse, max_bytes: int) -> bytes:
    """The whole body, at most ``max_bytes``; ``_ShortBodyError`` when the peer closes early."""
    expected = response.length  # None: chunked or until close
    if expected is not None and expected > max_bytes:
        raise _TooLargeError(f"announces {expected} bytes, larger than {max_bytes} bytes")
    body = bytearray()
    while True:
        try:
            chunk = response.read(_CHUNK)
        except http.client.IncompleteRead:  # chunked; its count covers only this read: not worth quoting
            raise _ShortBodyError("closed the connection before the end of its chunked body") from None
        if not chunk:
            break
        body += chunk
        if len(body) > max_bytes:
            raise _TooLargeError(f"answer larger than {max_bytes} bytes")
    if expected is not None and len(body) < expected:  # read(amt) returns b"" at a premature close
        raise _ShortBodyError(f"closed the connection after {len(body)} of {expected} body bytes")
    return bytes(body)


class _TooLargeError(Exception):
    pass


class _ShortBodyError(Exception):
    pass


def request(
    url: str,
    *,
    method: str = "GET",
    body: Any = None,
    timeout_s: float = 10.0,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[int, bytes]:
    """``(status, body)`` of one exchange completed within ``timeout_s`` overall; ``body`` is sent as JSON.

    Any status is returned (redirects too, never followed). Raises :class:`HttpTimeoutError` at the
    deadline and :class:`HttpError` for anything else that went wrong; ``ValueError`` for a bad
    ``url`` or ``timeout_s``.
    """
    seconds = check_timeout(timeout_s)
    parsed = urllib.parse.urlsplit(check_http_url(url))
    assert parsed.hostname is not None  # checked above
    tls = parsed.scheme == "https"
    deadline = _Deadline(seconds)
    data = None if body is None else json.dumps(body).encode()
    headers = {"Connection": "close", "Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    target = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
    what = f"{method} {url}"
    connection = _Connection(parsed.hostname, parsed.port or (443 if tls else 80), tls=tls, deadline=deadline)
    try:
        connection.request(method, target, body=data, headers=headers)
        response = connection.getresponse()
        return response.status, _read_body(response, max_bytes)
    except TimeoutError:
        raise HttpTimeoutError(f"{what} timed out after {seconds:g} s (no complete answer)") from None
    except _UnreachableError as exc:
        raise HttpError(f"{what}: unreachable ({exc})") from None
    except (_TooLargeError, _ShortBodyError) as exc:
        raise HttpError(f"{what}: {exc}") from None
    except http.client.RemoteDisconnected:  # before BadStatusLine: it is one
        raise HttpError(f"{what}: the peer closed the connection without answering") from None
    except http.client.BadStatusLine as exc:
        raise HttpError(f"{what} did not answer HTTP (it sent {str(exc.args[0])[:80]!r})") from None
    except http.client.HTTPException as exc:
        raise HttpError(f"{what} did not answer HTTP ({type(exc).__name__}: {exc})") from None
    except OSError as exc:
        raise HttpError(f"{what}: connection failed ({exc})") from None
    finally:
        connection.close_all()
