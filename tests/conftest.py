"""Shared factories: the fake OpenRouter, a runner for ./your_program.sh, a scripted model, a tool context."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import shlex
import shutil
import subprocess
import tempfile
import termios
import time
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
                timeout: float = 60, stdin: Any = subprocess.DEVNULL, wrap: tuple[str, ...] = ()) -> Run:
    """Run ./your_program.sh as the tester does: another working directory, stdin closed, no TTY (`wrap`: a command
    line the program's is appended to)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENROUTER_", "SOLO_"))}
    home = cwd.parent / "home"  # an empty home: the machine's own ~/.claude/skills must not leak in
    home.mkdir(exist_ok=True)
    full_env.update({"OPENROUTER_BASE_URL": base_url, "OPENROUTER_API_KEY": "sk-test-secret-123", "HOME": str(home)})
    full_env.update(env or {})
    proc = subprocess.run([*wrap, str(PROGRAM), *args], cwd=cwd, env=full_env, stdin=stdin,
                          capture_output=True, text=True, timeout=timeout)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def program_env(cwd: Path, base_url: str, extra: dict | None = None) -> dict:
    """The environment run() gives the program: its own home, no OPENROUTER_*/SOLO_* of the machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENROUTER_", "SOLO_"))}
    home = cwd.parent / "home"
    home.mkdir(exist_ok=True)
    return {**env, "OPENROUTER_BASE_URL": base_url, "OPENROUTER_API_KEY": "sk-test-secret-123", "HOME": str(home),
            **(extra or {})}


@pytest.fixture
def run() -> Callable[..., Run]:
    """The program runner."""
    return run_program


# --- A session on a terminal ---------------------------------------------------------------------


PROMPT = r"(?:^|\n)> "  # the session's prompt at the start of a line ("-> ok" in a tool line is not it)


class Terminal:
    """The program on a pty that is its controlling terminal, so Ctrl-C and Ctrl-D work as typed."""

    def __init__(self, cwd, env, stdout=None, args=()):
        master, slave = pty.openpty()

        def own_terminal() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen([str(PROGRAM), *args], cwd=cwd, env=env, stdin=slave, stdout=stdout or slave,
                                     stderr=slave, preexec_fn=own_terminal, close_fds=True)
        os.close(slave)
        self.master, self.seen, self.transcript = master, "", ""

    def expect(self, pattern: str, timeout: float = 15) -> str:
        """Read until the pattern shows; return everything read up to and including it."""
        deadline = time.monotonic() + timeout
        while not (match := re.search(pattern, self.seen)):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.master], [], [], left)[0]:
                raise AssertionError(f"{pattern!r} never showed; screen:\n{self.seen}\n"
                                     f"whole transcript: {self.transcript[-2000:]!r}")
            try:
                chunk = os.read(self.master, 4096).decode(errors="replace")
                self.seen += chunk
                self.transcript += chunk
            except OSError:
                raise AssertionError(f"{pattern!r} never showed before exit; screen:\n{self.seen}") from None
        done, self.seen = self.seen[: match.end()], self.seen[match.end():]
        return done

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def ask(self, line: str, answer: str) -> None:
        """Type a line, wait for the answer and the next prompt."""
        self.send(line + "\r")
        self.expect(answer)
        self.expect(PROMPT)

    def wait(self, timeout: float = 10) -> int:
        code = self.proc.wait(timeout)
        os.close(self.master)
        return code


@pytest.fixture
def terminal(workspace):
    terminals = []

    def start(server, *args: str, stdout=None, env: dict | None = None, first: str = "> ", term: str = "dumb") -> Terminal:
        env = {**(env or {**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "k"}), "TERM": term}
        terminals.append(Terminal(workspace, env, stdout, args))
        terminals[-1].expect(first)  # the session is up and waiting
        return terminals[-1]

    yield start
    end_all(terminals)


def end_all(terminals: list[Terminal]) -> None:
    """Kill each terminal's program that a test left running."""
    for t in terminals:
        if t.proc.poll() is None:
            t.proc.kill()
            t.proc.wait()


def screen_of(transcript: str, width: int = 80) -> str:
    """What a terminal `width` columns wide shows after these bytes, scrolled-off rows included: characters (wide ones
    two columns, combining ones none), a row that fills wraps, CR, LF (to the next row's start, as a terminal's
    output, where the line discipline turns it into CR LF), backspace, tab, and the sequences solo moves and erases
    with (CSI A, C, J, K); colours and other sequences change nothing here."""
    rows: list[list[str]] = [[]]
    row = column = 0
    for token in re.findall(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[^\[]?|.", transcript, re.DOTALL):
        csi = re.fullmatch(r"\x1b\[(\d*)([ACJK])", token)
        if csi and csi.group(2) in "AC":  # up, right: never past the edges
            up, right = int(csi.group(1) or 1) * (csi.group(2) == "A"), int(csi.group(1) or 1) * (csi.group(2) == "C")
            row, column = max(0, row - up), min(column + right, width - 1)
        elif csi and csi.group(1) in ("", "0"):  # erase to the end of the row (K) or of the screen (J)
            del rows[row][column:]
            if csi.group(2) == "J":
                del rows[row + 1:]
        elif token in ("\r", "\n", "\b", "\t"):
            row += token == "\n"
            column = {"\r": 0, "\n": 0, "\b": max(0, column - 1), "\t": min(width - 1, column + 8 - column % 8)}[token]
        elif token.isprintable() and (size := agent.width_of(token)):
            if column + size > width:
                row, column = row + 1, 0
            rows += [[] for _ in range(row + 1 - len(rows))]
            line = rows[row] + [" "] * (column - len(rows[row]))
            rows[row] = line[:column] + [token] + [""] * (size - 1) + line[column + size:]
            column += size
        rows += [[] for _ in range(row + 1 - len(rows))]
    return "\n".join("".join(line).rstrip() for line in rows)


# --- A session in tmux ---------------------------------------------------------------------------


class Tmux:
    """A session named "solo" in a tmux server of its own (its socket in a short folder of its own: a socket's path
    has a limit), read as a screen: what a person sees, after the terminal rewrapped what was drawn; keys and pastes
    as tmux sends them, a paste bracketed where the program asks for it."""

    SESSION = "solo"

    def __init__(self, server, cwd: Path, *args: str, width: int = 200, height: int = 30):
        self.folder = Path(tempfile.mkdtemp(prefix="tmux-"))
        env = program_env(cwd, server.url, {"SOLO_HOME": str(cwd.parent / "solo-home")})
        self.env = {k: v for k, v in env.items() if k not in ("NO_COLOR", "TMUX", "TMUX_PANE")}  # not the runner's tmux
        script = self.folder / "run"
        script.write_text(f"#!/bin/sh\ncd {shlex.quote(str(cwd))} && exec {shlex.quote(str(PROGRAM))} "
                          + " ".join(map(shlex.quote, args)) + "\n")
        script.chmod(0o755)
        self.tmux("new-session", "-d", "-s", self.SESSION, "-x", str(width), "-y", str(height), str(script))
        self.tmux("set-option", "-g", "remain-on-exit", "on")

    def tmux(self, *args: str) -> str:
        """A tmux command against this server; what it printed."""
        return subprocess.run(["tmux", "-S", str(self.folder / "socket"), "-f", "/dev/null", *args], env=self.env,
                              capture_output=True, text=True, timeout=10, check=True).stdout

    def screen(self, history: bool = False, joined: bool = False) -> list[str]:
        """The rows on the screen now (and those scrolled off it before them; lines the terminal wrapped joined),
        trailing spaces cut, empty rows at the bottom left out."""
        shown = self.tmux("capture-pane", "-p", "-t", self.SESSION, *("-S", "-") * history, *["-J"] * joined)
        return "\n".join(row.rstrip() for row in shown.split("\n")).rstrip("\n").split("\n")

    def wait(self, condition: Callable[[list[str]], Any], what: str = "", timeout: float = 15) -> list[str]:
        """The screen once the condition holds for it."""
        deadline = time.monotonic() + timeout
        while not condition(rows := self.screen()):
            assert time.monotonic() < deadline, f"{what or 'it'} never showed; the screen:\n" + "\n".join(rows)
            time.sleep(0.05)
        return rows

    def send(self, *keys: str) -> None:
        """Keys typed, as tmux's send-keys names them (-l: the text as it is)."""
        self.tmux("send-keys", "-t", self.SESSION, *keys)

    def resize(self, columns: int) -> None:
        """The window made this many columns wide, as a person drags a terminal's edge."""
        self.tmux("resize-window", "-t", self.SESSION, "-x", str(columns))

    def paste(self, text: str) -> None:
        """Paste a text as a terminal does, bracketed if the program turned that on."""
        (self.folder / "paste").write_text(text)
        self.tmux("load-buffer", str(self.folder / "paste"))
        self.tmux("paste-buffer", "-p", "-t", self.SESSION)

    def close(self) -> None:
        """The server ended (with the session) and its folder removed."""
        with contextlib.suppress(subprocess.SubprocessError):  # gone already: fine
            self.tmux("kill-server")
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def tmux(workspace):
    """Start the program in tmux in the workspace (its arguments, the window's size; `ready`: a screen to wait for
    first), ended with the test; skipped where tmux is not installed."""
    if not shutil.which("tmux"):
        pytest.skip("tmux is not installed")
    sessions: list[Tmux] = []

    def start(server, *args: str, width: int = 200, height: int = 30,
              ready: Callable[[list[str]], Any] | None = None) -> Tmux:
        sessions.append(Tmux(server, workspace, *args, width=width, height=height))
        if ready:
            sessions[-1].wait(ready, "the session up and waiting")
        return sessions[-1]

    yield start
    for session in sessions:
        session.close()
