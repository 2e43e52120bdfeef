#!/bin/sh
# Prepares .venv beside the project with the dependencies listed in pyproject.toml (runtime and test),
# and compiles app/ so that start-up reads bytecode even where PYTHONDONTWRITEBYTECODE is set. The
# project itself is not installed: an installed project would cost every start-up an import hook.
# Idempotent; a lock serialises concurrent first runs.
set -e
here=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
venv="$here/.venv"
prepare() {
  [ -f "$venv/.ready" ] && [ ! "$here/pyproject.toml" -nt "$venv/.ready" ] && return 0
  echo "solo: preparing $venv (first run)" >&2
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "solo: needs Python 3.11 or newer" >&2; exit 1; }
  deps=$(python3 -c 'import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print(" ".join(project["dependencies"] + project["optional-dependencies"]["test"]))' "$here/pyproject.toml")
  # uv when present (fast); pip when there is no uv or uv fails (say, on a proxy it does not trust)
  if ! { command -v uv >/dev/null 2>&1 && uv venv --quiet --allow-existing --python python3 "$venv" &&
         uv pip install --quiet --python "$venv/bin/python" $deps; }; then
    python3 -m venv --clear "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $deps
  fi
  touch "$venv/.ready"
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
