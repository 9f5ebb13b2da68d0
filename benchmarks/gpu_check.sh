#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU whose Python already has torch (a CUDA build), and no
# network, install instrument, run the tests marked `gpu`, profile a tiny CUDA training loop and
# analyse its traces, time the first profiled step against later ones; print a summary. About 3-6
# minutes; each part has its own time limit, 12 minutes in all. CI never runs it (no GPU there).
#
#   bash benchmarks/gpu_check.sh                 # PYTHON=python3, WHEELS=wheels, OUT=outputs/gpu_check
#   PYTHON=/opt/conda/bin/python WHEELS=/data/wheels bash benchmarks/gpu_check.sh
#
# It installs into that Python (a GPU machine lent for the check, not a workstation): the project
# with `pip install --no-deps -e .`, and what the project and its tests need from WHEELS, a folder of
# wheels built beforehand on a machine with network, for the GPU machine's Python version:
#
#   pip download -d wheels --only-binary=:all: --python-version 3.11 --platform manylinux2014_x86_64 \
#       'attrs>=23.1' 'ijson>=3.2' 'rich>=13' 'pytest>=8' 'setuptools>=68' wheel 'nvtx>=0.2.10'
#
# (attrs: the library; ijson, rich: `instrument analyze`; pytest; setuptools, wheel: the editable
# install builds with them, without network; nvtx: the NVTX test, skipped without it.) Whatever the
# Python already has is kept. Exit status: 0 when every part passed, 1 when one failed, 2 when there
# is no CUDA torch or a wheel is missing.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
WHEELS=${WHEELS:-wheels}
OUT=${OUT:-outputs/gpu_check}
NEEDED=("attrs>=23.1" "ijson>=3.2" "rich>=13" "pytest>=8" "setuptools>=68" "wheel")

part() { printf '\n== %s\n' "$*"; }
say() { printf 'gpu_check: %s\n' "$*" >&2; }

part "torch and the GPU"
if ! timeout 120 "$PY" -c '
import sys, torch
ok = torch.cuda.is_available()
where = torch.cuda.get_device_name(0) if ok else "no CUDA device"
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}): {where}")
sys.exit(0 if ok else 1)'; then
    say "$PY has no torch that sees a CUDA GPU; install a CUDA build of torch first (docs/quickstart.md, GPU checks)"
    exit 2
fi

part "install (no network: $WHEELS)"
wanted=("${NEEDED[@]}")
if [ -d "$WHEELS" ] && compgen -G "$WHEELS/nvtx-*.whl" > /dev/null; then
    wanted+=("nvtx>=0.2.10")
fi
if [ -d "$WHEELS" ]; then
    if ! timeout 180 "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" "${wanted[@]}"; then
        say "a wheel is missing from $WHEELS (see the pip download line at the top of this script)"
        exit 2
    fi
else
    say "no $WHEELS folder: using what $PY already has"
fi
if ! timeout 180 "$PY" -m pip install --quiet --no-index --no-deps --no-build-isolation -e .; then
    say "could not install the project (needs setuptools>=68 and wheel in $PY)"
    exit 2
fi
rm -rf "$OUT"
mkdir -p "$OUT"

part "pytest -m gpu"
timeout 300 "$PY" -m pytest -m gpu tests/recorders/test_gpu.py -p no:cacheprovider -q -rA 2>&1 | tee "$OUT/pytest.log"
tests_rc=${PIPESTATUS[0]}

part "a profiled CUDA loop (steps 2 and 4 of 4; two forward stages, one scheduled update)"
timeout 120 "$PY" - "$OUT/profile" <<'EOF' 2>&1 | tee "$OUT/loop.log"
import sys

import torch

import instrument as ins

cfg = ins.ProfilerConfig(
    save_path=sys.argv[1],
    steps=(2, 4),
    contents=("cpu", "cuda"),
    schedule=ins.Schedule(wait=1, warmup=1, active=2),
)
ins.configure(cfg, role="actor_rollout_ref", rank=0, world_size=1)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
batch = torch.randn(64, 512, device="cuda")


@ins.profiled_stage("generate_sequences")
def generate() -> torch.Tensor:
    with torch.no_grad():
        x = batch
        for _ in range(8):  # autoregressive-ish: one forward per token
            x = model(x)
    torch.cuda.synchronize()
    return x


@ins.profiled_stage("compute_log_prob")
def log_prob(x: torch.Tensor) -> None:
    with torch.no_grad():
        torch.log_softmax(model(x), dim=-1)
    torch.cuda.synchronize()


@ins.profiled_stage("update_actor", scheduled=True)
def update(x: torch.Tensor) -> None:
    for i, mb in enumerate(x.chunk(6)):
        with ins.profile_window(mini_batch=i):
            optimizer.zero_grad()
            model(mb).pow(2).mean().backward()
            optimizer.step()
    torch.cuda.synchronize()


for step in range(1, 5):
    with ins.profile_step(step, last=(step == 4)):
        x = generate()
        log_prob(x)
        update(x)
files = ins.finish()
print(f"{len(files)} files written")
EOF
loop_rc=${PIPESTATUS[0]}

part "instrument analyze"
timeout 60 "$PY" -m instrument analyze "$OUT/profile" --no-png --quiet
timeout 60 "$PY" -m instrument analyze "$OUT/profile" --no-png --quiet --json > "$OUT/analysis.json"
analyze_rc=$?

part "the first profiled step against later ones (benchmarks/first_step.py; goal <= 1.5)"
timeout 240 "$PY" benchmarks/first_step.py --device cuda --repeats 3 2>&1 | grep -v '^USDT' | tee "$OUT/first_step.log"
first_rc=${PIPESTATUS[0]}

part "summary"
"$PY" - "$OUT" "$tests_rc" "$loop_rc" "$analyze_rc" "$first_rc" <<'EOF'
import json
import re
import sys
from pathlib import Path

out, tests_rc, loop_rc, analyze_rc, first_rc = Path(sys.argv[1]), *map(int, sys.argv[2:])
log = (out / "pytest.log").read_text(errors="replace") if (out / "pytest.log").exists() else ""
counts = dict((word, int(n)) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)", log))
print(f"tests marked gpu: exit {tests_rc}, {counts or 'no summary line'}")
print(f"profiled loop:    exit {loop_rc}, {len(list((out / 'profile').glob('*.pt.trace.json.gz')))} traces")
ok = tests_rc == 0 and counts.get("passed", 0) > 0 and loop_rc == 0 and analyze_rc == 0  # all skipped: no GPU seen
try:
    analysis = json.loads((out / "analysis.json").read_text())
except (OSError, ValueError) as exc:
    print(f"instrument analyze: exit {analyze_rc}, no JSON ({exc})")
    sys.exit(1)
rows = analysis["stages"]
with_kernels = [r for r in rows if (r.get("median_kernel_ms") or 0) > 0]
print(f"instrument analyze: exit {analyze_rc}, {len(with_kernels)} of {len(rows)} stage rows hold kernels")
for r in sorted(rows, key=lambda r: (r["step"] or 0, r["stage"])):
    kernels = sum(p["kernels"] for p in r["per_rank"])
    print(f"  step {r['step']} {r['stage']:<20} wall {r['median_ms']:8.2f} ms  gpu {r['median_kernel_ms'] or 0:8.2f} ms  {kernels} kernels")
for g in analysis["gpu"]:
    if g["step"] is None:
        print(
            f"  rank {g['rank']} GPU: busy {g['busy_us'] / 1e3:.2f} ms of {g['span_us'] / 1e3:.2f} ms "
            f"(compute {g['compute_us'] / 1e3:.2f} ms, memory {g['memory_us'] / 1e3:.2f} ms)"
        )
first = (out / "first_step.log").read_text(errors="replace") if (out / "first_step.log").exists() else ""
ratios = re.findall(r"^\s+(discrete|continuous)\s+stage range\s+([\d.]+)", first, re.M)
print(f"first profiled step: exit {first_rc}, stage range / later ones: " + (", ".join(f"{m} {r}" for m, r in ratios) or "none printed"))
ok = ok and bool(rows) and len(with_kernels) == len(rows) and bool(analysis["gpu"]) and first_rc == 0 and bool(ratios)
print("GPU CHECK", "PASSED" if ok else "FAILED", f"(logs and traces in {out})")
sys.exit(0 if ok else 1)
EOF
