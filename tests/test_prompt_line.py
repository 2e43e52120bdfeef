"""The prompt line on a real terminal (issue 33): Ctrl-Z and fg, @file checks and Tab, history of whole prompts,
pasted blocks. Sessions run in a pty (tests/conftest.py's Terminal), under a job-control shell where Ctrl-Z needs
one, and in tmux where a paste must be bracketed."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import subprocess
import termios

import pytest

from tests.conftest import PROGRAM, Terminal
from tests.fake_openrouter import reply


def user_turns(body) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


class Shell(Terminal):
    """An interactive bash with job control on a pty that is its controlling terminal: a session started from it
    stops at Ctrl-Z and comes back at fg, as in a person's terminal."""

    def __init__(self, cwd, env):
        master, slave = pty.openpty()

        def own_terminal() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile", "-i"], cwd=cwd, env={**env, "PS1": "$ "},
                                     stdin=slave, stdout=slave, stderr=slave, preexec_fn=own_terminal, close_fds=True)
        os.close(slave)
        self.master, self.seen, self.transcript = master, "", ""
        self.expect(r"\$ ")


@pytest.fixture
def shell(workspace):
    shells = []

    def start(server, term: str = "xterm") -> Shell:
        env = {**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "k", "TERM": term}
        shells.append(Shell(workspace, env))
        return shells[-1]

    yield start
    for one in shells:
        if one.proc.poll() is None:
            one.proc.kill()
            one.proc.wait()


@pytest.mark.parametrize("term", ["xterm", "dumb"])
def test_after_ctrl_z_and_fg_the_prompt_and_the_line_typed_so_far_are_drawn_again(serve, shell, term):
    server = serve(lambda body: reply(f"answered {user_turns(body)[-1]}"))
    sh = shell(server, term)
    sh.send(f"{PROGRAM}\r")
    sh.expect(r"\n> ")
    sh.send("half typed")
    sh.expect("half typed")
    sh.send("\x1a")  # Ctrl-Z: the shell has the terminal again
    sh.expect(r"Stopped.*\n(?:\x1b\[\?2004h)?\$ ")
    sh.send("fg\r")
    sh.expect(r"fg\r\n.*your_program\.sh\r\n")  # the shell names the job it brings back
    sh.expect(r"^\r?> half typed")  # the prompt and the line so far, at once, before any key
    sh.send(" more\r")  # the line goes on where it was, in readline's modes: echoed once, not twice by the shell
    shown = sh.expect("answered half typed more")
    assert shown.partition("answered")[0].count(" more") == 1 and server.bodies and user_turns(server.bodies[-1]) == ["half typed more"]
    sh.expect(r"\n> |\x1b\[K> ")
    sh.send("\x04")
    sh.expect(r"\$ ")
    sh.send("exit\r")
    assert sh.wait() == 0
