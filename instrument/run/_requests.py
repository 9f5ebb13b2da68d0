"""Request spans: one generation request inside a rollout stage, recorded in the always-on step timeline.

``with request(prompt_tokens=p) as r: ...; r.output_tokens = n`` marks one call; ``@request(output_tokens=...)``
marks every call of a function or ``async def`` coroutine. A request belongs to the innermost stage of its
own context (thread or asyncio task: the stage stack of :mod:`instrument.run._stages`) and to the step open
when it began. Its hot path is what a stage span's is (:mod:`instrument.run._timeline`): two clock reads and
one ``deque.append`` of a plain tuple, plus the stage stack's read and the token counts' checks; naming the
stage happens on the writer's thread. With the timeline off, before ``configure`` or after ``finish`` it
records nothing and checks nothing.
"""

from __future__ import annotations

import functools
import inspect
import math
import operator
from collections.abc import Callable
from threading import get_ident
from time import perf_counter_ns
from types import TracebackType
from typing import Any, TypeVar

from instrument.run._stages import _STAGES
from instrument.run._state import STATE
from instrument.run._timeline import OUTSIDE_STAGE, REQUEST
from instrument.timeline import MAX_TOKENS

__all__ = ["OUTSIDE_STAGE", "OUTSIDE_STEP", "TOKEN_COUNT", "request"]

_F = TypeVar("_F", bound=Callable[..., Any])

OUTSIDE_STEP = "request outside a step"
"""The misuse kind of a request begun while no step was open."""
TOKEN_COUNT = "request token count"
"""The misuse kind of a token count that is not a count (negative, NaN, not an int, over 10^15)."""


class request:  # noqa: N801 - reads as a function at call sites, like profiled_stage
    """Mark one generation request: ``with request(prompt_tokens=p) as r: ...; r.output_tokens = n``.

    As a decorator, ``@request(output_tokens=lambda result: len(result.token_ids))`` marks every call of a
    function or ``async def`` coroutine; a callable ``prompt_tokens`` is given the call's arguments, a callable
    ``output_tokens`` its result. Token counts are ints from 0 to 10^15 (``None``: not known); another value is
    refused with one warning and recorded as not known. Make one object per request (the decorator does).
    """

    __slots__ = ("_open", "output_tokens", "prompt_tokens")

    def __init__(self, *, prompt_tokens: Any = None, output_tokens: Any = None) -> None:
        # Stored as given: the with form's counts are checked when recorded, the decorator's readers by __call__.
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self._open: tuple[Any, int, object, int] | None = None

    def __repr__(self) -> str:
        return f"request(prompt_tokens={self.prompt_tokens!r}, output_tokens={self.output_tokens!r})"

    def __enter__(self) -> request:
        state = STATE
        if state.engaged:
            spans = state.spans
            if spans is not None:  # a step is open and the timeline is on: the hot path
                stack = _STAGES.get()
                self._open = (spans, state.step, stack[-1] if stack else None, perf_counter_ns())
            else:
                self._open = _opened_elsewhere()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        opened = self._open
        if opened is None:
            return
        ended = perf_counter_ns()
        self._open = None
        spans, step, stage, started = opened
        prompt, output = self.prompt_tokens, self.output_tokens
        if type(prompt) is not int or not 0 <= prompt <= MAX_TOKENS:
            prompt = -1 if prompt is None else _count("prompt_tokens", prompt)
        if type(output) is not int or not 0 <= output <= MAX_TOKENS:
            output = -1 if output is None else _count("output_tokens", output)
        spans.append((REQUEST, step, started, ended, get_ident(), stage, prompt, output))

    def __call__(self, func: _F) -> _F:
        """Mark every call of ``func`` (a function or an ``async def`` coroutine) as one request."""
        if not callable(func):
            raise TypeError(f"request(...) decorates a callable, not {func!r}")
        if inspect.isasyncgenfunction(func):
            raise TypeError(
                f"request(...) cannot decorate the async generator {func.__qualname__}: wrap the loop that consumes "
                "it in `with instrument.request(...) as r:` (docs/rollout.md, Marking requests)"
            )
        if inspect.iscoroutinefunction(func):
            return _wrap_coroutine(func, self.prompt_tokens, self.output_tokens)  # type: ignore[return-value]
        return _wrap(func, self.prompt_tokens, self.output_tokens)  # type: ignore[return-value]


def _wrap(func: Callable[..., Any], prompt: Any, output: Any) -> Callable[..., Any]:
    # One function with its hot path inline, as profiled_stage's _wrap: each Python call out of it would cost.
    state = STATE
    prompt_of = prompt if callable(prompt) else None
    result_of = output if callable(output) else None

    @functools.wraps(func)
    def request_call(*args: Any, **kwargs: Any) -> Any:
        if not state.engaged:
            return func(*args, **kwargs)
        spans = state.spans
        if spans is None:  # no step open, no timeline or no run: the with form's cold path
            marked = request(prompt_tokens=_read(prompt_of, args, kwargs) if prompt_of else prompt)
            with marked:
                result = func(*args, **kwargs)
                marked.output_tokens = _read(result_of, (result,), {}) if result_of else output
                return result
        step, stack = state.step, _STAGES.get()
        stage = stack[-1] if stack else None
        count = _read(prompt_of, args, kwargs) if prompt_of else prompt
        if type(count) is not int or not 0 <= count <= MAX_TOKENS:
            count = -1 if count is None else _count("prompt_tokens", count)
        started = perf_counter_ns()
        try:
            result = func(*args, **kwargs)
        except BaseException:
            spans.append(
                (REQUEST, step, started, perf_counter_ns(), get_ident(), stack[-1] if stack else None, count, -1)
            )
            raise
        ended = perf_counter_ns()
        made = output
        if result_of is not None:
            try:  # inline, not _read: a call out of here costs the hot path ~100 ns
                made = result_of(result)
            except Exception as exc:
                _unread(result_of, exc)
                made = None
        if type(made) is not int or not 0 <= made <= MAX_TOKENS:
            made = -1 if made is None else _count("output_tokens", made)
        spans.append((REQUEST, step, started, ended, get_ident(), stage, count, made))
        return result

    return request_call


def _wrap_coroutine(func: Callable[..., Any], prompt: Any, output: Any) -> Callable[..., Any]:
    prompt_of = prompt if callable(prompt) else None
    result_of = output if callable(output) else None

    @functools.wraps(func)
    async def request_coroutine(*args: Any, **kwargs: Any) -> Any:
        if not STATE.engaged:
            return await func(*args, **kwargs)
        marked = request(prompt_tokens=_read(prompt_of, args, kwargs) if prompt_of else prompt, output_tokens=output)
        with marked:
            result = await func(*args, **kwargs)
            if result_of is not None:
                marked.output_tokens = _read(result_of, (result,), {})
            return result

    return request_coroutine


def _read(reader: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A token count read by the user's callable; one that raises is a count not known (named once)."""
    try:
        return reader(*args, **kwargs)
    except Exception as exc:
        _unread(reader, exc)
        return None


def _unread(reader: Callable[..., Any], exc: Exception) -> None:
    """The user's token-count reader raised: named once, the count not known."""
    session = STATE.session
    if session is not None:
        session.misuse(
            TOKEN_COUNT,
            "instrument: a request's token count could not be read (%s raised %s: %s): recorded as not known; "
            "training continues",
            getattr(reader, "__qualname__", repr(reader)),
            type(exc).__name__,
            exc,
        )


def _count(field: str, value: Any) -> int:
    """A token count off the fast path: ``None`` and refused values are -1 (not known), an integer type is an int."""
    if value is None:
        return -1
    if not isinstance(value, bool):
        try:
            count = operator.index(value)  # numpy's integers too
        except TypeError:
            pass
        else:
            if 0 <= count <= MAX_TOKENS:
                return count
    shown = "NaN" if isinstance(value, float) and math.isnan(value) else repr(value)[:80]
    session = STATE.session
    if session is not None:
        session.misuse(
            TOKEN_COUNT,
            "instrument: request(%s=%s) is not a token count (an int from 0 to 10^15; None when not known): the "
            "request is recorded without it; training continues",
            field,
            shown,
        )
    return -1


def _opened_elsewhere() -> tuple[Any, int, object, int] | None:
    """A request begun off the hot path: none recorded (no run, no timeline, finished) or one outside a step."""
    session = STATE.session
    timeline = None if session is None else session.timeline
    if timeline is None or session.finished or not timeline.active:
        return None
    if STATE.spans is None:  # engaged, the timeline on, no step open
        session.misuse(
            OUTSIDE_STEP,
            "instrument: a request ran outside any step (role %s, rank %s): it is recorded under step 0, counted "
            "in no step's time; open the step around the rollout that makes it (`with instrument.profile_step(step):`)"
            "; training continues",
            session.role,
            session.rank,
        )
    stack = _STAGES.get()
    return (timeline.pending, STATE.step, stack[-1] if stack else None, perf_counter_ns())
