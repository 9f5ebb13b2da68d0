"""The message for an optional dependency that is not installed: what needs it and the extra that brings it.

Standard library only, so the registry, the metrics and the config may all use it.
"""

from __future__ import annotations

__all__ = ["needs_extra"]


def needs_extra(what: str, extra: str, exc: ModuleNotFoundError) -> ModuleNotFoundError:
    """What to raise instead of ``exc``: ``{what} needs 'nvtx' (not installed): pip install 'instrument-rl[nvtx]'``."""
    missing = exc.name or str(exc)
    return ModuleNotFoundError(
        f"{what} needs {missing!r} (not installed): pip install 'instrument-rl[{extra}]'", name=exc.name
    )
