"""The interactive session, driven on a real pseudo-terminal (stdlib pty) as a user would."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import subprocess
import termios
import time

import pytest

from tests.conftest import PROGRAM
from tests.fake_openrouter import call, last_result, reply, tool_then


class Terminal:
    """The program on a pty that is its controlling terminal, so Ctrl-C and Ctrl-D work as typed."""

    def __init__(self, cwd, env, stdout=None):
        master, slave = pty.openpty()

        def own_terminal() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen([str(PROGRAM)], cwd=cwd, env=env, stdin=slave, stdout=stdout or slave,
                                     stderr=slave, preexec_fn=own_terminal, close_fds=True)
        os.close(slave)
        self.master, self.seen, self.transcript = master, "", ""

    def expect(self, pattern: str, timeout: float = 15) -> str:
        """Read until the pattern shows; return everything read up to and including it."""
        deadline = time.monotonic() + timeout
        while not (match := re.search(pattern, self.seen)):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.master], [], [], left)[0]:
                raise AssertionError(f"{pattern!r} never showed; screen:\n{self.seen}")
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
        self.expect("> ")

    def wait(self, timeout: float = 10) -> int:
        code = self.proc.wait(timeout)
        os.close(self.master)
        return code


@pytest.fixture
def terminal(workspace):
    terminals = []

    def start(server, stdout=None) -> Terminal:
        env = {**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "k", "TERM": "dumb"}
        terminals.append(Terminal(workspace, env, stdout))
        terminals[-1].expect("> ")  # the session is up and waiting
        return terminals[-1]

    yield start
    for t in terminals:
        if t.proc.poll() is None:
            t.proc.kill()
            t.proc.wait()


def user_turns(body) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


def test_two_turns_share_context_and_ctrl_d_exits_0(serve, terminal):
    server = serve(lambda body: reply(f"answer {len(user_turns(body))}"))
    term = terminal(server)
    term.ask("first question", "answer 1")
    term.ask("second question", "answer 2")
    assert user_turns(server.bodies[1]) == ["first question", "second question"]
    assert server.bodies[1]["messages"][2] == {"role": "assistant", "content": "answer 1"}
    term.send("\x04")
    assert term.wait() == 0


def test_a_confirmation_answered_n_runs_nothing(serve, terminal, workspace):
    server = serve(tool_then([call("Bash", {"command": "touch made"})], lambda body: "result: " + last_result(body)))
    term = terminal(server)
    term.send("make a file\r")
    term.expect(r"Bash wants to run:\r\ntouch made\r\nAllow Bash\? \[y/n/a\] ")
    term.send("n\r")
    term.expect("result: Error: the user declined")
    assert not (workspace / "made").exists()
    term.send("/exit\r")
    assert term.wait() == 0


def test_always_answer_stops_asking(serve, terminal, workspace):
    def model(body):
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        if body["messages"][-1]["role"] == "user" or done == 1:
            return reply(tool_calls=[call("Bash", {"command": f"touch f{done}"})])
        return reply("both made")
    server = serve(model)
    term = terminal(server)
    term.send("go\r")
    term.expect(r"\[y/n/a\] ")
    term.send("a\r")
    term.expect("both made")
    assert (workspace / "f0").exists() and (workspace / "f1").exists()
    assert "Allow" not in term.seen
    term.send("\x04")
    assert term.wait() == 0


def test_ctrl_c_cancels_a_turn_and_returns_to_the_prompt(serve, terminal, workspace):
    def model(body):
        text = user_turns(body)[-1]
        if text == "slow" and body["messages"][-1]["role"] == "user":
            return reply(tool_calls=[call("Bash", {"command": "echo $$ > pid; sleep 60"})])
        return reply(f"quick answer to {text}; {len(body['messages'])} messages")
    server = serve(model)
    term = terminal(server)
    term.send("slow\r")
    term.expect(r"\[y/n/a\] ")
    term.send("y\r")
    deadline = time.monotonic() + 10
    while not ((workspace / "pid").exists() and (workspace / "pid").read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    term.send("\x03")
    term.expect("cancelled")
    term.expect("> ")
    term.send("fast\r")
    term.expect("quick answer to fast; 2 messages")  # system + this prompt: the cancelled turn is gone
    pid = int((workspace / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    term.send("\x03")  # Ctrl-C at an empty prompt only says how to leave
    term.expect("press Ctrl-C again to leave")
    term.send("\x03")  # and a second one within a second leaves
    assert term.wait() == 0


def test_commands_help_cost_model_clear(serve, terminal):
    server = serve(lambda body: reply(f"{body['model']} sees {len(user_turns(body))}"))
    term = terminal(server)
    term.ask("/help", "/clear")
    term.ask("hello", "anthropic/claude-haiku-4.5 sees 1")
    term.ask("/cost", r"1 requests, 100 prompt tokens .*\$0\.0010")
    term.ask("/model anthropic/claude-haiku-other", "model: anthropic/claude-haiku-other")
    term.ask("/clear", "new conversation")
    term.ask("again", "anthropic/claude-haiku-other sees 1")
    term.send("/exit\r")
    assert term.wait() == 0


def test_prompts_go_to_the_terminal_and_answers_to_a_redirected_stdout(serve, terminal, tmp_path):
    server = serve(lambda body: reply(f"answer {len(user_turns(body))}"))
    with open(tmp_path / "answers.txt", "w") as out:
        term = terminal(server, stdout=out)
        term.send("one\r")
        term.expect("> ")
        term.send("two\r")
        term.expect("> ")
        term.send("\x04")
        assert term.wait() == 0
    assert (tmp_path / "answers.txt").read_text() == "answer 1\nanswer 2\n"
    assert "answer" not in term.transcript and term.transcript.count("> ") == 3
