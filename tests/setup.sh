#!/bin/sh
# Prepares .venv beside the project with the runtime and test dependencies from pyproject.toml.
# Idempotent and safe to run concurrently (a lock serialises first runs).
set -e
here=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
venv="$here/.venv"
lock="$here/.venv.lock"
prepare() {
  [ -f "$venv/.ready" ] && [ ! "$here/pyproject.toml" -nt "$venv/.ready" ] && return 0
  echo "solo: preparing $venv (first run)" >&2
  if command -v uv >/dev/null 2>&1; then
    uv venv --quiet --allow-existing --python python3 "$venv"
    uv pip install --quiet --python "$venv/bin/python" -e "$here[test]"
  else
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$here[test]"
  fi
  touch "$venv/.ready"
}
if command -v flock >/dev/null 2>&1; then
  exec 9>"$lock"
  flock 9
fi
prepare
