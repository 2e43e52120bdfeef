"""Install and first run: `pip install .` gives a `solo` command, the launcher works through a symlink on PATH,
and its first run installs only the runtime dependency. Offline: builds use what tests/setup.sh installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import requests

from app import main as agent
from tests.conftest import PROGRAM, ROOT

PROJECT_FILES = ("pyproject.toml", "README.md", "your_program.sh", "tests/setup.sh", "app/__init__.py", "app/main.py")


def copy_project(to: Path) -> Path:
    """The files a fresh clone needs to build or run, copied (no .venv, no build leftovers in the repository)."""
    for name in PROJECT_FILES:
        (to / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, to / name)
    return to


def must_run(args: list, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """A command with the test's environment and these variables; it must succeed."""
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_pip_install_gives_a_solo_command_and_no_top_level_app(tmp_path, workspace):
    src, venv = copy_project(tmp_path / "src"), tmp_path / "venv"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    must_run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp_path / "dist", src], tmp_path)
    must_run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    wheel = tmp_path / "dist" / f"solo_agent-{agent.VERSION}-py3-none-any.whl"  # the version is main.py's
    must_run([*pip, "--python", venv / "bin" / "python", "install", "--no-deps", "--no-index", wheel], tmp_path)
    record = next(venv.glob("lib/python*/site-packages/solo_agent-*.dist-info/RECORD")).read_text()
    installed = {line.split(",")[0].split("/")[0] for line in record.splitlines()}
    assert "solo" in installed and "app" not in installed  # the package is `solo`; nothing named `app`
    (workspace / "solo").mkdir()  # a folder of the working directory must not shadow the installed package
    (workspace / "solo" / "main.py").write_text("raise SystemExit('the workspace solo/main.py ran')\n")
    deps = Path(requests.__file__).parents[1]  # requests, from the test's own environment (offline)
    path = f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"
    result = must_run(["solo", "--version"], workspace, PATH=path, PYTHONPATH=str(deps))
    assert result.stdout == f"solo {agent.VERSION}\n"


def test_the_launcher_works_through_a_chain_of_symlinks_on_path(tmp_path, workspace):
    (tmp_path / "bin").mkdir()
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "absolute").symlink_to(PROGRAM)
    (tmp_path / "bin" / "solo-dev").symlink_to(Path("..", "links", "absolute"))  # relative, to another link
    path = f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"
    assert must_run(["solo-dev", "--version"], workspace, PATH=path).stdout == f"solo {agent.VERSION}\n"


FAKE_UV = """#!/bin/sh
# Records how it was called; `uv venv DIR` makes DIR/bin/python run the test's own interpreter.
echo "$*" >> "$UV_LOG"
if [ "$1" = venv ]; then
  for venv; do :; done
  mkdir -p "$venv/bin"
  printf '#!/bin/sh\\nexec %s "$@"\\n' "$TEST_PYTHON" > "$venv/bin/python"
  chmod +x "$venv/bin/python"
fi
"""


def installs(log: Path) -> list[list[str]]:
    """The packages each `uv pip install` in the log named (its options and the venv's path left out)."""
    return [[word for word in line.split()[2:] if not word.startswith("-") and "/" not in word]
            for line in log.read_text().splitlines() if line.startswith("pip install")]


def test_the_first_run_installs_only_the_runtime_dependency(tmp_path, workspace):
    project = copy_project(tmp_path / "clone")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "uv").write_text(FAKE_UV)
    (tmp_path / "bin" / "uv").chmod(0o755)
    log = tmp_path / "uv.log"
    env = {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "UV_LOG": str(log),
           "TEST_PYTHON": sys.executable}
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    first = must_run([project / "your_program.sh", "--version"], workspace, **env)
    assert first.stdout == f"solo {agent.VERSION}\n" and "preparing" in first.stderr
    assert installs(log) == [deps["dependencies"]]
    must_run([project / "tests" / "setup.sh"], workspace, **env)  # the test command adds the test extras
    assert installs(log)[1:] == [deps["dependencies"] + deps["optional-dependencies"]["test"]]
    calls = log.read_text()
    again = must_run([project / "your_program.sh", "--version"], workspace, **env)
    assert again.stderr == "" and log.read_text() == calls  # later runs set nothing up
