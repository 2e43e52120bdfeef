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
from pathlib import Path

import pytest

from app import main as agent
from tests.conftest import PROGRAM, Terminal, end_all
from tests.fake_openrouter import call, reply

LINE = r"> (?:\x1b\[\?2004h)?"  # the prompt, and bracketed paste on for the line (where the terminal is not dumb)


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
        env = {**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "k", "TERM": term,
               "PATH": f"{Path(PROGRAM).parent}:{os.environ['PATH']}"}  # typed short, whatever the checkout's path
        shells.append(Shell(workspace, env))
        return shells[-1]

    yield start
    end_all(shells)


@pytest.mark.parametrize("term", ["xterm", "dumb"])
def test_after_ctrl_z_and_fg_the_prompt_and_the_line_typed_so_far_are_drawn_again(serve, shell, term):
    server = serve(lambda body: reply(f"answered {user_turns(body)[-1]}"))
    sh = shell(server, term)
    sh.send("your_program.sh\r")
    sh.expect(r"\n> ")
    sh.send("half typed")
    sh.expect("half typed")
    sh.send("\x1a")  # Ctrl-Z: the shell has the terminal again
    sh.expect(r"Stopped.*\n(?:\x1b\[\?2004h)?\$ ")
    sh.send("fg\r")
    sh.expect(r"fg\r\n.*your_program\.sh\r\n")  # the shell names the job it brings back
    sh.expect(rf"^\r?{LINE}half typed")  # the prompt and the line so far, at once, before any key
    sh.send(" more\r")  # the line goes on where it was, in readline's modes: echoed once, not twice by the shell
    shown = sh.expect("answered half typed more")
    assert shown.partition("answered")[0].count(" more") == 1 and server.bodies and user_turns(server.bodies[-1]) == ["half typed more"]
    sh.expect(r"\n> |\x1b\[K> ")
    sh.send("\x04")
    sh.expect(r"\$ ")
    sh.send("exit\r")
    assert sh.wait() == 0


def test_ctrl_z_in_a_turn_shows_the_cursor_for_the_shell_and_fg_draws_the_status_line_again(serve, shell, workspace):
    def model(body):
        if body["messages"][-1]["role"] == "user":
            return reply(tool_calls=[call("Bash", {"command": "while [ ! -f go ]; do sleep 0.05; done; echo went"})])
        return reply("the command " + body["messages"][-1]["content"].split()[0])

    sh = shell(serve(model))
    sh.send("your_program.sh --yes\r")
    sh.expect(r"\n> ")
    sh.send("run it\r")
    sh.expect(r"\x1b\[\?25l.*esc to interrupt")  # the status line, the cursor hidden on it
    sh.send("\x1a")
    sh.expect(r"Stopped.*\n(?:\x1b\[\?2004h)?\$ ")
    assert sh.transcript.rindex("\x1b[?25h") > sh.transcript.rindex("\x1b[?25l")  # the shell's prompt has its cursor
    sh.send("fg\r")
    sh.expect(r"fg\r\n.*your_program\.sh.*\r\n")
    sh.expect(r"\x1b\[\?25l\r\x1b\[K.*esc to interrupt")  # drawn anew where the shell left the cursor
    (workspace / "go").touch()
    sh.expect("the command went")
    sh.expect(r"\n> |\x1b\[K> ")
    sh.send("\x04")
    sh.expect(r"\$ ")
    assert sh.transcript.rindex("\x1b[?25h") > sh.transcript.rindex("\x1b[?25l")
    sh.send("exit\r")
    assert sh.wait() == 0


def test_an_at_path_that_names_nothing_is_said_with_close_names_and_the_prompt_waits_in_the_line(serve, terminal,
                                                                                                workspace):
    (workspace / "src").mkdir()
    (workspace / "src" / "main.py").write_text("print(1)\n")
    (workspace / "notes.md").write_text("n" * 1500)
    server = serve(lambda body: reply(f"answered {len(server.bodies)}"))
    term = terminal(server)
    term.send("read @src/mian.py now\r")
    term.expect(r"solo: no file or folder @src/mian\.py \(did you mean @src/main\.py[^)\n]*\?\); not sent: fix it, or Enter "
                r"sends it as it is\r\n")
    term.expect(r"> read @src/mian\.py now")  # kept in the line, to fix
    assert not server.bodies
    term.send("\x15read @src/main.py and @notes.md now\r")  # Ctrl-U, typed again
    shown = term.expect("answered 1")
    assert "solo: attached @src/main.py (9 bytes)\r\n" in shown and "solo: attached @notes.md (1.5 KB)\r\n" in shown
    sent = user_turns(server.bodies[-1])[-1]
    assert sent.startswith("read @src/main.py and @notes.md now") and '<file path="src/main.py">\nprint(1)\n' in sent
    term.expect(r"\n> ")
    term.send("ask @nobody please\r")  # a word that names nothing: said, and Enter again sends it as written
    term.expect(r"solo: no file or folder @nobody; not sent: fix it, or Enter sends it as it is\r\n")
    term.expect("> ask @nobody please")
    term.send("\r")
    term.expect("answered 2")
    assert user_turns(server.bodies[-1])[-1] == "ask @nobody please"
    term.expect(r"\n> ")
    term.send("\x04")
    assert term.wait() == 0


@pytest.mark.parametrize("term", ["xterm", "dumb"])
def test_tab_after_at_lists_the_choices_at_the_first_press(serve, terminal, workspace, term):
    for name in ("notes.md", "notes.txt", "other.txt"):
        (workspace / name).write_text("x\n")
    server = serve(lambda body: reply("ok"))
    session = terminal(server, term=term)
    session.send("read @no\t")  # one press: the common part goes in, and both choices show under it
    shown = session.expect(rf"@notes\.md +@notes\.txt\s*\r\n{LINE}read @notes\.")
    assert "other.txt" not in shown
    session.send("t\t\r")
    session.expect(r"attached @notes\.txt \(2 bytes\)")
    session.expect(r"(?<![a-z])ok\r\n")
    assert user_turns(server.bodies[-1])[-1].startswith('read @notes.txt\n\n<file path="notes.txt">\nx\n</file>')


def test_a_prompt_of_several_lines_is_one_history_entry_restored_whole_across_sessions(serve, terminal, workspace):
    home = workspace.parent / "solo-home"
    folder = agent.Sessions(agent.Config(api_key="k", cwd=workspace, solo_home=home)).folder
    folder.mkdir(parents=True)
    (folder / "history").write_text("an old prompt\nold with a literal \\n in it\n")  # an older file: a line a prompt
    (folder / "history").chmod(0o600)
    server = serve(lambda body: reply(f"answered {len(server.bodies)}"))
    env = {**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "k", "SOLO_HOME": str(home)}
    term = terminal(server, env=env)
    term.send("first line\\\r")  # a backslash goes on to the next line
    term.expect(r"first line\\\r\n[^\n]+ $")  # the next line's prompt ("… ", cut anywhere by the reads)
    term.send("second line\r")
    term.expect(r"answered 1\r\n> ")
    term.send("pasted one\rpasted two\rpasted three\r")  # a paste without brackets: its lines come at once
    term.expect(r"answered 2\r\n> ")
    pasted, typed = "pasted one\npasted two\npasted three", "first line\nsecond line"
    assert [user_turns(body)[-1] for body in server.bodies] == [typed, pasted]
    term.send("\x1b[A\x1b[A\r")  # up twice: the whole prompt of two lines, not its second line
    term.expect(r"answered 3\r\n> ")
    term.send("\x12second\r")  # Ctrl-R finds it by a word of its second line, whole
    term.expect(r"answered 4\r\n> ")
    assert [user_turns(body)[-1] for body in server.bodies[2:]] == [typed, typed]
    term.send("\x04")
    assert term.wait() == 0
    lines = (folder / "history").read_text().split("\n")
    assert lines == ["an old prompt", "old with a literal \\n in it", '\x1e"first line\\nsecond line"',
                     '\x1e"pasted one\\npasted two\\npasted three"', '\x1e"first line\\nsecond line"', ""]  # a prompt a line
    term = terminal(server, env=env)  # a new session: the same entries, whole
    for ups, sent in ((1, typed), (2, pasted), (5, "old with a literal \\n in it")):
        term.send("\x1b[A" * ups + "\r")
        term.expect(rf"answered {server.bodies.__len__() + 1}\r\n> ")
        assert user_turns(server.bodies[-1])[-1] == sent
    term.send("\x04")
    assert term.wait() == 0


def as_text(rows: list[str]) -> str:
    """A screen's rows as one text, each row a line as tmux prints it."""
    return "".join(row + "\n" for row in rows)


def shown(term, pattern: str) -> str:
    """The tmux session's screen as one text, once the pattern shows on it."""
    return as_text(term.wait(lambda rows: re.search(pattern, as_text(rows)), repr(pattern)))


def test_a_paste_of_many_lines_is_one_marker_in_the_line_and_goes_whole_at_enter(serve, tmux):
    server = serve(lambda body: reply(f"got {len(user_turns(body)[-1].splitlines())} lines"))
    term = tmux(server, width=100, height=30)
    shown(term, r"(?m)^> ?$")
    pasted = "".join(f"line {i} of the paste\n" for i in range(1, 202))
    term.paste(pasted)
    screen = shown(term, r"(?m)^> \[Pasted text #1 \+201 lines\]$")  # in the line, not echoed line by line
    assert "line 2 of the paste" not in screen
    term.send("-l", " then this")  # still the same line: nothing was sent
    shown(term, r"(?m)^> \[Pasted text #1 \+201 lines\] then this$")
    assert not server.bodies
    term.send("Enter")
    shown(term, r"(?m)^got 202 lines$")
    assert user_turns(server.bodies[-1]) == [pasted + " then this"]  # the whole text went to the model
    shown(term, r"(?m)^> ?$")
    term.paste("short one\nshort two\n")  # a few lines: shown as they are, sent at Enter
    screen = shown(term, r"(?m)^> short one\nshort two\n")
    assert len(server.bodies) == 1 and "Pasted text" not in screen.split("got 202 lines")[1]
    term.send("Enter")
    shown(term, r"(?m)^got 2 lines$")
    assert user_turns(server.bodies[-1])[-1] == "short one\nshort two"


def test_a_bracketed_paste_keeps_its_tabs_and_the_enter_typed_right_after_it_sends_it(serve, terminal):
    server = serve(lambda body: reply("received"))
    term = terminal(server, term="xterm")
    term.expect(r"\x1b\[\?2004h")
    assert "\n> \x1b[?2004h" in term.transcript  # right after the prompt the terminal is asked to mark pastes
    pasted = "".join(f"def f{i}():\r\treturn {i}\r" for i in range(3))  # 6 lines, Tabs in them: text, not completion
    term.send(f"\x1b[200~{pasted}\x1b[201~\r")  # Enter comes in the same read as the paste's end
    term.expect(r"\[Pasted text #1 \+6 lines\]")
    term.expect("received")
    assert user_turns(server.bodies[-1]) == [pasted.replace("\r", "\n").strip()]
    term.expect(r"\x1b\[K> ")
    term.send("\x04")
    assert term.wait() == 0


def test_the_first_screen_breaks_its_lines_between_parts_at_a_narrow_terminal(serve, shell, workspace):
    server = serve(lambda body: reply("hi"))
    sh = shell(server)
    sh.send("stty cols 40 rows 30\r")  # a narrow terminal, sized before the session starts
    sh.expect(r"\$ ")
    sh.send("your_program.sh --yes\r")
    shown = sh.expect(rf"\n{LINE}").split("--yes\r\n", 1)[1]
    lines = [re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]|\r", "", line) for line in shown.split("\r\n")[:-1]]  # the shell's too
    assert lines == [f"solo {agent.VERSION}", "model anthropic/claude-haiku-4.5", str(workspace),
                     "⚠ permissions bypassPermissions: nothing asks, all runs", "sandbox off",
                     "/help · Esc stops · Ctrl-O expands", "! shell · @ file · Ctrl-D quits"]  # no part cut in two
    sh.send("\x04")
    sh.expect(r"\$ ")
    sh.send("exit\r")
    assert sh.wait() == 0
