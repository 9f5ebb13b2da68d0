"""Compile ``nvtxlog.c`` into an NVTX injection library with gcc.

The NVTX v3 headers come from the ``nvidia-nvtx`` wheel (a dev dependency); no CUDA toolkit
or GPU is needed.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
from pathlib import Path

__all__ = ["SOURCE", "build_injection_library", "headers_dir"]

SOURCE = Path(__file__).with_name("nvtxlog.c")
_MARKER = Path("nvtx3") / "nvToolsExt.h"


def headers_dir() -> Path:
    """The include directory that holds ``nvtx3/nvToolsExt.h`` in the installed ``nvidia-nvtx`` package.

    Raises ``FileNotFoundError`` when the package is missing or holds no NVTX headers.
    """
    try:
        dist = importlib.metadata.distribution("nvidia-nvtx")
    except importlib.metadata.PackageNotFoundError as exc:
        raise FileNotFoundError("the nvidia-nvtx package is not installed (pip install nvidia-nvtx)") from exc
    candidates = sorted(
        {
            Path(str(dist.locate_file(entry))).parents[1]
            for entry in dist.files or []
            if entry.as_posix().endswith(_MARKER.as_posix())
        }
    )
    for include in candidates:
        if (include / _MARKER).is_file():
            return include
    raise FileNotFoundError(f"nvidia-nvtx {dist.version} holds no {_MARKER.as_posix()}")


def build_injection_library(out_dir: Path) -> Path:
    """Compile the logging tool into ``out_dir/libnvtxlog.so`` and return its path.

    Raises ``FileNotFoundError`` without gcc or headers, ``RuntimeError`` carrying gcc's
    stderr when compilation fails.
    """
    gcc = shutil.which("gcc")
    if gcc is None:
        raise FileNotFoundError("gcc is not on PATH")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / "libnvtxlog.so"
    command = [
        gcc,
        "-shared",
        "-fPIC",
        "-O2",
        "-Wall",
        "-Wextra",
        f"-I{headers_dir()}",
        "-o",
        str(library),
        str(SOURCE),
        "-ldl",
        "-lpthread",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"gcc failed ({done.returncode}): {' '.join(command)}\n{done.stderr}")
    return library
