#!/bin/sh
# Runs solo from any working directory. The first run sets up .venv beside this script (uv when
# present, else python3 -m venv + pip), sending all set-up output to stderr; later runs exec the
# prepared interpreter directly, paying no set-up or dependency check.
set -e
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
venv="$here/.venv"
if [ ! -f "$venv/.ready" ] || [ "$here/pyproject.toml" -nt "$venv/.ready" ]; then
  "$here/tests/setup.sh" >&2
fi
# Run our own file by absolute path: a workspace's own app/ folder can never shadow it.
exec "$venv/bin/python" "$here/app/main.py" "$@"
