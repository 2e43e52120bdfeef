"""Shared factories: the fake OpenRouter, a runner for ./your_program.sh, a scripted model, a tool context."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app import main as agent
from tests.fake_openrouter import FakeOpenRouter

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "your_program.sh"


@dataclass
class Run:
    """A finished run of the program."""

    code: int
    stdout: str
    stderr: str


@pytest.fixture(autouse=True)
def hermetic(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the machine's OPENROUTER_*/SOLO_* settings or its home (~/.claude, ~/.solo, ~/.netrc)."""
    for name in list(os.environ):
        if name.startswith(("OPENROUTER_", "SOLO_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))


@pytest.fixture
def ctx(tmp_path: Path) -> agent.ToolContext:
    """A tool context whose working directory is a fresh temp folder."""
    return agent.ToolContext(cwd=tmp_path, env=agent.command_env(dict(os.environ)))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A fresh working directory that, like the tester's, holds its own app/main.py."""
    folder = tmp_path / "workspace-apple-1"
    (folder / "app").mkdir(parents=True)
    (folder / "app" / "main.py").write_text("raise SystemExit('the workspace app/main.py ran')\n")
    return folder


@pytest.fixture
def serve():
    """Start a fake OpenRouter for a model script; every body it got must match the schema."""
    servers: list[FakeOpenRouter] = []

    def start(model: Callable[[dict], Any], **kwargs: Any) -> FakeOpenRouter:
        server = FakeOpenRouter(model, **kwargs).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)
        assert server.problems == [], server.problems


def run_program(args: list[str], *, cwd: Path, base_url: str, env: dict | None = None,
                timeout: float = 60, stdin: Any = subprocess.DEVNULL) -> Run:
    """Run ./your_program.sh as the tester does: another working directory, stdin closed, no TTY."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENROUTER_", "SOLO_"))}
    home = cwd.parent / "home"  # an empty home: the machine's own ~/.claude/skills must not leak in
    home.mkdir(exist_ok=True)
    full_env.update({"OPENROUTER_BASE_URL": base_url, "OPENROUTER_API_KEY": "sk-test-secret-123", "HOME": str(home)})
    full_env.update(env or {})
    proc = subprocess.run([str(PROGRAM), *args], cwd=cwd, env=full_env, stdin=stdin,
                          capture_output=True, text=True, timeout=timeout)
    return Run(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def run() -> Callable[..., Run]:
    """The program runner."""
    return run_program
