#!/bin/sh
# Runs solo from any working directory, also through a symlink. The first run sets up .venv beside this
# script with the runtime dependency only (uv when present, else python3 -m venv + pip; the test extras
# are the test command's), sending all set-up output to stderr; later runs exec the prepared interpreter
# directly, paying only a symlink test and two file-time comparisons.
set -e
self=$0
while [ -L "$self" ]; do  # a symlink on PATH: follow it (and any chain) to the real script, beside its .venv
  link=$(readlink -- "$self")
  case $link in /*) self=$link ;; *) self=$(dirname -- "$self")/$link ;; esac
done
here=$(CDPATH= cd -- "$(dirname -- "$self")" && pwd)
venv="$here/.venv"
if [ ! -f "$venv/.ready" ] || [ "$here/pyproject.toml" -nt "$venv/.ready" ] || [ "$here/app/main.py" -nt "$venv/.ready" ]; then
  "$here/tests/setup.sh" --runtime >&2
fi
# -P keeps the working directory off sys.path, so a workspace's own app/ folder can never shadow
# ours; importing (rather than running the file) lets Python reuse the compiled bytecode. A Ctrl-C
# during the imports ends quietly with 130; cli() then handles signals itself.
exec "$venv/bin/python" -P -c 'import signal, sys; signal.signal(signal.SIGINT, lambda *_: sys.exit(130)); sys.path.insert(0, sys.argv.pop(1)); from app.main import cli; cli()' "$here" "$@"
