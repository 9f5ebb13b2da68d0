"""Session fixtures for real-vLLM tests; import them into a test module by name.

from tests.vllm_support.fixtures import tiny_model, vllm_python  # noqa: F401
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests.vllm_support import server

SKIP_REASON = f"set {server.PYTHON_ENV_VAR} (make test does)"


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM environment's interpreter: skipped without one, except on CI, where its absence is a failure."""
    python = server.vllm_python()
    if python is None:
        if os.environ.get("CI"):
            pytest.fail(f"{server.PYTHON_ENV_VAR} is unset on CI: the real-vLLM tests would be skipped silently")
        pytest.skip(SKIP_REASON)
    if shutil.which(python) is None:
        pytest.fail(f"{server.PYTHON_ENV_VAR}={python} is not an executable")
    return python


@pytest.fixture(scope="session")
def tiny_model(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama, built once per session."""
    started = time.monotonic()
    model_dir = server.build_tiny_model(vllm_python, tmp_path_factory.mktemp("vllm") / "tiny-llama")
    print(f"\n[vllm] tiny model built in {time.monotonic() - started:.1f} s: {model_dir}")
    return model_dir
