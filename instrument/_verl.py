"""Translate verl's profiler keys into ProfilerConfig keys, keeping verl's meaning.

verl writes ``global_profiler.*`` (trainer-wide) and ``<role>.profiler.*``
(per role); users pass either section, or both, with or without those
prefixes for verl-only keys such as ``tool_config.torch.contents`` and
``finish_hook_cmd``.  Where verl gives a value its own meaning, the
translation keeps it: ``ranks: []`` profiles rank 0, ``tool: null`` or
``steps: null`` profile nothing, ``contents: []`` collects the default,
``schedule.active: 0`` means no schedule, an empty ``finish_hook_ranks``
runs the hook on the profiled ranks, and ``tool: nsys`` is our ``nvtx``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["VERL_KEYS", "VERL_IGNORED", "is_verl_key", "translate"]

_ROLE_PREFIXES = ("profiler.", "global_profiler.")

_TOOLS = {None: "none", "nsys": "nvtx", "torch": "torch"}


def _tool(value: Any) -> list[tuple[str, Any]]:
    if value in _TOOLS:
        return [("tool", _TOOLS[value])]
    raise ValueError(
        f"verl 'tool' must be one of null, 'nsys', 'torch' to move over (npu, torch_memory and "
        f"precision_debugger have no counterpart here): {value!r}"
    )


def _steps(value: Any) -> list[tuple[str, Any]]:
    # verl profiles no step when steps is null.
    return [("enable", False)] if value is None else [("steps", value)]


def _ranks(value: Any) -> list[tuple[str, Any]]:
    # verl profiles rank 0 when ranks is empty and all_ranks is false.
    return [("ranks", [0] if value in ([], ()) else value)]


def _contents(value: Any) -> list[tuple[str, Any]]:
    return [] if value in ([], (), None) else [("contents", value)]


def _schedule_field(name: str) -> Callable[[Any], list[tuple[str, Any]]]:
    def set_field(value: Any) -> list[tuple[str, Any]]:
        return [(f"schedule.{name}", value)]

    return set_field


def _same(name: str) -> Callable[[Any], list[tuple[str, Any]]]:
    def set_field(value: Any) -> list[tuple[str, Any]]:
        return [(name, value)]

    return set_field


# verl key (after the optional "profiler." / "global_profiler." prefix) -> translation
VERL_KEYS: dict[str, Callable[[Any], list[tuple[str, Any]]]] = {
    "tool": _tool,
    "steps": _steps,
    "ranks": _ranks,
    "enable": _same("enable"),
    "all_ranks": _same("all_ranks"),
    "save_path": _same("save_path"),
    "relocate_results": _same("relocate_results"),
    "tool_config.torch.contents": _contents,
    "tool_config.torch.discrete": _same("discrete"),
    "tool_config.nsys.discrete": _same("discrete"),
    "global_tool_config.nsys.discrete": _same("discrete"),
    **{
        f"tool_config.torch.schedule.{name}": _schedule_field(name)
        for name in ("skip_first", "wait", "warmup", "active", "repeat", "skip_first_wait")
    },
    # profile_token_* and finish_hook_* are collected and resolved together in translate().
    "tool_config.torch.profile_token_start": _same("token_start"),
    "tool_config.torch.profile_token_end": _same("token_end"),
    "finish_hook_cmd": _same("finish_hook_cmd"),
    "finish_hook_ranks": _same("finish_hook_ranks"),
    "finish_hook_all_ranks": _same("finish_hook_all_ranks"),
    "finish_hook_timeout_s": _same("finish_hook_timeout_s"),
}
"""verl's profiler keys this package moves over (each also under ``profiler.`` / ``global_profiler.``)."""

VERL_IGNORED = (
    "profile_continuous_steps",
    "global_tool_config.nsys.controller_nsight_options",
    "global_tool_config.nsys.worker_nsight_options",
    "global_tool_config.torch_memory",
    "global_tool_config.precision_debugger",
    "tool_config.npu",
    "tool_config.torch_memory",
    "tool_config.precision_debugger",
)
"""verl keys accepted but not applied (one warning names them): they have no counterpart here."""


def _strip(key: str) -> str:
    for prefix in _ROLE_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


def _ignored(key: str) -> bool:
    return any(key == ignored or key.startswith(ignored + ".") for ignored in VERL_IGNORED)


def is_verl_key(key: str) -> bool:
    """Whether ``key`` is one of verl's profiler keys (prefixed, or verl-only without prefix)."""
    stripped = _strip(key)
    if stripped == key and not (key.startswith(("tool_config.", "finish_hook_", "global_tool_config."))):
        return False
    return stripped in VERL_KEYS or _ignored(stripped)


def translate(items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Replace verl keys in ``items`` by ProfilerConfig keys, in order; warn once about ignored ones."""
    out: list[tuple[str, Any]] = []
    hook: dict[str, Any] = {}
    schedule: dict[str, Any] = {}
    tokens: dict[str, Any] = {}
    ignored: list[str] = []
    # Grouped keys are resolved together, then put where their group first appeared,
    # so that a later override of the same field still wins.
    hook_at = schedule_at = -1
    for key, value in items:
        if not is_verl_key(key):
            out.append((key, value))
            continue
        stripped = _strip(key)
        if _ignored(stripped):
            ignored.append(key)
            continue
        for target, translated in VERL_KEYS[stripped](value):
            if target.startswith("finish_hook_"):
                hook_at = len(out) if hook_at < 0 else hook_at
                hook[target] = translated
            elif target in ("token_start", "token_end"):
                tokens[target] = translated
            elif target.startswith("schedule."):
                schedule_at = len(out) if schedule_at < 0 else schedule_at
                schedule[target] = translated
            else:
                out.append((target, translated))
    if ignored:
        warnings.warn(
            f"verl profiler keys without a counterpart here were ignored: {', '.join(ignored)}",
            UserWarning,
            stacklevel=4,
        )
    groups = []
    # verl schedules only when active > 0; its default of all zeros means "no schedule".
    if schedule.get("schedule.active", 0):
        groups.append((schedule_at, list(schedule.items())))
    if tokens.get("token_start") is not None or tokens.get("token_end") is not None:
        if tokens.get("token_end") is None:
            raise ValueError("verl 'profile_token_end' must be set when 'profile_token_start' is: null")
        out.append(("token_window", [tokens.get("token_start") or 0, tokens["token_end"]]))
    if hook_at >= 0:
        groups.append((hook_at, _finish_hook(hook, out)))
    for at, group in sorted(groups, key=lambda g: g[0], reverse=True):
        out[at:at] = group
    return out


def _finish_hook(hook: dict[str, Any], items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    if hook.get("finish_hook_cmd") is None:
        return []  # verl keeps the other finish_hook_* keys even when no command is set
    out: list[tuple[str, Any]] = [("finish_hook.cmd", hook["finish_hook_cmd"])]
    if "finish_hook_timeout_s" in hook:
        out.append(("finish_hook.timeout_s", hook["finish_hook_timeout_s"]))
    if hook.get("finish_hook_all_ranks"):
        out.append(("finish_hook.all_ranks", True))
    elif hook.get("finish_hook_ranks"):
        out.append(("finish_hook.ranks", hook["finish_hook_ranks"]))
    else:
        # verl runs the hook on the profiled ranks when no hook ranks are given.
        selection = dict(items)
        out.append(("finish_hook.ranks", selection.get("ranks", [0])))
        out.append(("finish_hook.all_ranks", bool(selection.get("all_ranks", False))))
    return out
