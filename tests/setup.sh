#!/bin/sh
# Prepares .venv beside the project from pyproject.toml, and compiles app/ so that start-up reads bytecode even
# where PYTHONDONTWRITEBYTECODE is set. `tests/setup.sh` (the test command) installs the runtime dependencies and
# the test extras; `tests/setup.sh --runtime` (the launcher's first run) only the runtime ones. The project itself
# is not installed: an installed project would cost every start-up an import hook. Idempotent; a lock serialises
# concurrent first runs.
set -e
here=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
venv="$here/.venv"
# a stamp file's time says when set-up last finished: .ready for the runtime dependencies, .ready-test with the extras
if [ "$1" = --runtime ]; then extras="" stamp=.ready said="(first run)"
else extras=test stamp=.ready-test said="with the test extras"; fi
prepare() {
  [ -f "$venv/$stamp" ] && [ ! "$here/pyproject.toml" -nt "$venv/$stamp" ] && return 0
  echo "solo: preparing $venv $said" >&2
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "solo: needs Python 3.11 or newer" >&2; exit 1; }
  deps=$(python3 -c 'import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print(" ".join(project["dependencies"] + [d for e in sys.argv[2:] for d in project["optional-dependencies"][e]]))' \
    "$here/pyproject.toml" $extras)
  # uv when present (fast); pip when there is no uv or uv fails (say, on a proxy it does not trust). A venv that
  # runtime set-up finished is kept and added to; anything else is made anew.
  if ! { command -v uv >/dev/null 2>&1 && uv venv --quiet --allow-existing --python python3 "$venv" &&
         uv pip install --quiet --python "$venv/bin/python" $deps; }; then
    { [ -f "$venv/.ready" ] && "$venv/bin/python" -m pip --version >/dev/null 2>&1; } || python3 -m venv --clear "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $deps
  fi
  touch "$venv/$stamp"
}
compile() {
  "$venv/bin/python" -m compileall -q "$here/app" >&2 || true
  touch "$venv/.ready"
}
if command -v flock >/dev/null 2>&1; then
  exec 9>"$here/.venv.lock"
  flock 9
fi
prepare
compile
