#!/usr/bin/env bash
# The prepared GPU check, as one short call on a machine with a CUDA GPU (about 5 minutes in all):
#   ESS_TORCH_PIN="torch==2.13.0" bash benchmarks/gpu_check.sh
# (install a CUDA build of torch into .venv first, see README "CUDA"). It covers what only CUDA runs (README, "The
# real model": the copy stream, the pinned host pool and zero-copy reads, the pinned staging of the write-back, sparse
# MLA over the device pool, the CUDA backend rule): the CUDA tests (every kernel family against its reference on the
# GPU, the engine lossless on CUDA, DeepSeek's decode step over the device pool, the copy stream), then the transfer
# check (zero-copy gather vs one copy per row vs the host-to-device peak), the attention check (torch CUDA vs the
# NumPy reference) and the real model's decode engine on CUDA (dense / resident / offloaded steps per second, the
# torch kernels). On a machine without CUDA every part says so and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/ess.sh setup
PY=.venv/bin/python
rc=0
timeout 150 "$PY" -m pytest -q -m cuda -p no:cacheprovider tests/ || rc=$?
[ "$rc" -eq 5 ] && rc=0          # no CUDA test collected on a CPU-only machine
timeout 200 "$PY" benchmarks/gpu_check_transfer.py || rc=$?
timeout 150 "$PY" benchmarks/gpu_check_attention.py || rc=$?
timeout 240 "$PY" benchmarks/engine_decode.py --device cuda --context 4096 --steps 4 --repeats 2 || rc=$?
exit "$rc"
