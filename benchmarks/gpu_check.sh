#!/usr/bin/env bash
# The prepared GPU check, as one short call on a machine with a CUDA GPU (about 5 minutes in all):
#   ESS_TORCH_PIN="torch==2.13.0" bash benchmarks/gpu_check.sh
# (install a CUDA build of torch into .venv first, see README "CUDA"). It runs the CUDA tests, then the transfer
# check (zero-copy gather vs one copy per row vs the host-to-device peak), the attention check (torch CUDA vs the
# NumPy reference) and the real model's decode engine on CUDA (device pool on the GPU, pinned host pool, copy stream;
# dense / resident / offloaded steps per second). On a machine without CUDA every part says so and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/ess.sh setup
PY=.venv/bin/python
rc=0
timeout 120 "$PY" -m pytest -q -m cuda tests/ || rc=$?
[ "$rc" -eq 5 ] && rc=0          # no CUDA test collected on a CPU-only machine
timeout 200 "$PY" benchmarks/gpu_check_transfer.py || rc=$?
timeout 150 "$PY" benchmarks/gpu_check_attention.py || rc=$?
timeout 240 "$PY" benchmarks/engine_decode.py --device cuda --context 4096 --steps 4 --repeats 2 || rc=$?
exit "$rc"
