"""A profiled training process that stops where it is told, so a test can signal it there (run as a script).

``python _interrupted_child.py SAVE_PATH CONTROL AT``: two steps of one torch stage each, discrete traces of
real torch.profiler, a real ``/bin/sh`` finish hook that sleeps. It prints ``MARK <where>`` as it reaches
each place, and at ``AT`` it waits until the file ``CONTROL/sent`` exists (the test creates it once its
signal is sent), then goes on: so the signal lands there, whatever the machine's load.

The places: ``start`` (inside torch.profiler's first start: ``prepare_trace``, whose import of
``torch._inductor`` takes seconds), ``step`` (inside the stage's own work, its trace open), ``export``
(inside torch's ``export_chrome_trace`` of the first trace), ``between`` (after step 1, before step 2, no
trace open) and ``hook`` (the finish hook's shell is running; the test waits for ``CONTROL/hook-started``).
torch.profiler's two methods are wrapped only to print and wait; the real ones run.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

save, control, at = sys.argv[1], Path(sys.argv[2]), sys.argv[3]


def mark(where: str) -> None:
    """Say where the process is; at ``AT``, wait for the test's signal (its ``sent`` file)."""
    print(f"MARK {where}", flush=True)
    if where == at:
        while not (control / "sent").exists():
            time.sleep(0.005)


import torch  # noqa: E402 - after the helpers: the test reads marks only once torch is in
import torch.profiler  # noqa: E402

import instrument as ins  # noqa: E402


def _observed(name: str, where: str) -> None:
    real = getattr(torch.profiler.profile, name)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not seen.get(where):
            seen[where] = True
            mark(where)
        return real(self, *args, **kwargs)

    setattr(torch.profiler.profile, name, wrapper)


seen: dict[str, bool] = {}
_observed("prepare_trace", "start")
_observed("export_chrome_trace", "export")

hook = f'echo $$ > "{control}/hook.pid"; touch "{control}/hook-started"; sleep 60'
ins.configure(
    ins.ProfilerConfig(
        steps=(1, 2),
        save_path=save,
        contents=("cpu",),
        finish_hook=ins.FinishHook(cmd=hook, timeout_s=90, output="stderr"),
    ),
    role="actor",
)


class Worker:
    @ins.profiled_stage("update_actor")
    def update_actor(self, step: int) -> None:
        x = torch.randn(64, 64)
        for _ in range(20):
            x = (x @ x).tanh()
        if step == 1:
            mark("step")


worker = Worker()
for step in (1, 2):
    with ins.profile_step(step, last=step == 2):
        worker.update_actor(step)
    if step == 1:
        mark("between")
print(ins.finish(), flush=True)
os.write(1, b"MARK done\n")
