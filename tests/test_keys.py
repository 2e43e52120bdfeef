"""Issue 33, faults 2, 4 and 1, on real pseudo-terminals: questions answered by one key (Esc is no), what is typed
during a turn shown on an input line under the status line (Enter queues it), and the terminal's size followed
(SIGWINCH) so nothing stale is left when it shrinks (tmux reads the screen)."""

from __future__ import annotations

import os
import re
import threading
import time

from tests.conftest import PROMPT
from tests.fake_openrouter import call, last_result, reply
from tests.test_mcp import program_env
from tests.test_session import DRAWN_PROMPT, held, user_turns

QUESTION = r"Allow Bash\? \[y/n/a/s\] "


def asks(command: str):
    """A model that runs `command` for the prompt "go", then says what it gave; other prompts it answers."""
    def model(body):
        if body["messages"][-1]["role"] == "user" and user_turns(body)[-1] == "go":
            return reply(tool_calls=[call("Bash", {"command": command})])
        return reply(f"result of {user_turns(body)[-1]}: {last_result(body)}")
    return model


# --- Fault 2: one key answers a question ----------------------------------------------------------


def test_one_key_answers_a_question_whose_legend_shows_under_it_and_goes_after(serve, terminal, workspace):
    server = serve(asks("touch made"))
    term = terminal(server, term="xterm")
    term.send("go\r")
    shown = term.expect(QUESTION + r"\x1b7\r\n\x1b\[90my yes · n no · a always · s save it · Esc no\x1b\[0m\x1b8")
    assert "\x1b7" not in shown[:-200]  # the legend is drawn once, under the question, the cursor back after it
    term.send("y")  # no Enter
    term.expect(r"yes\r\n\x1b\[J")  # the answer said after the question, the legend taken off
    term.expect("result of go: ")
    assert (workspace / "made").exists()
    term.expect(DRAWN_PROMPT)
    term.send("next\r")
    term.expect(r"result of next: ")
    assert [user_turns(body)[-1] for body in server.bodies] == ["go", "go", "next"]


def test_the_enter_typed_after_an_answer_by_habit_is_not_an_empty_prompt(serve, terminal, workspace):
    server = serve(asks("touch made"))
    term = terminal(server)
    term.send("go\r")
    term.expect(QUESTION)
    term.send("y\r")
    term.expect("result of go: ")
    term.expect(PROMPT)
    term.send("after\r")
    term.expect("result of after: ")
    assert re.findall(r"\n> (.*)\r\n", term.transcript) == ["go", "after"]  # no empty prompt between them


def test_esc_answers_no_and_the_dumb_terminal_shows_the_legend_after_the_question(serve, terminal, workspace):
    server = serve(asks("touch made"))
    term = terminal(server)
    term.send("go\r")
    term.expect(QUESTION + r"\(y yes · n no · a always · s save it · Esc no\) ")
    term.send("\x1b")
    term.expect(r"^no\r\n")
    term.expect("result of go: Error: permission denied: the user declined")
    assert not (workspace / "made").exists()
    term.expect(PROMPT)
    assert "\x1b[" not in term.transcript  # nothing drawn a dumb terminal cannot show


def test_a_letter_that_is_no_answer_asks_again_and_ctrl_d_says_no(serve, terminal, workspace):
    server = serve(asks("touch made"))
    term = terminal(server)
    term.send("go\r")
    term.expect(QUESTION)
    term.send("\x1b[A")  # an arrow does nothing
    term.send("x")
    term.expect(r"x\r\nPlease answer y \(yes\), n \(no\), a \(always: Bash\(touch:\*\)\) or s \(save it\): ")
    term.send("\x04")
    term.expect("result of go: Error: permission denied: the user declined")
    assert not (workspace / "made").exists() and len(server.bodies) == 2


def test_hash_note_and_rewind_answer_on_one_key_and_esc_cancels_a_rewind(serve, terminal, workspace):
    (workspace / "a.txt").write_text("original\n")

    def model(body):
        if body["messages"][-1]["role"] == "user":
            return reply(tool_calls=[call("Write", {"file_path": "a.txt", "content": "changed\n"})])
        return reply(f"wrote, {len(body['messages'])} messages")

    server = serve(model)
    term = terminal(server, "--yes")
    term.send("#keep it short\r")
    term.expect(r"Add this line to ./CLAUDE.md\? \[y/n\] \(y yes · n no · Esc no\) ")
    term.send("n")
    term.expect(PROMPT)
    assert not (workspace / "CLAUDE.md").exists()
    term.ask("change it", "wrote, 4 messages")
    term.send("/rewind\r")
    term.expect(r"Go back to before which prompt \(1-1\)\? ")
    term.send("1\r")
    term.expect(r"both \(b\)\? \(c conversation · f files · b both · Esc cancel\) ")
    term.send("\x1b")
    term.expect(r"^cancelled\r\n")
    term.expect(PROMPT)
    assert (workspace / "a.txt").read_text() == "changed\n"  # nothing was put back
    term.send("/rewind\r")
    term.expect(r"\(1-1\)\? ")
    term.send("1\r")
    term.expect(r"both \(b\)\? ")
    term.send("f")
    term.expect("restored: ")
    term.expect(PROMPT)
    assert (workspace / "a.txt").read_text() == "original\n"


def test_esc_at_the_trust_question_declines_the_project_s_imports(serve, terminal, workspace):
    (workspace / "CLAUDE.md").write_text("Rules: @~/private_notes.txt\n")
    env = program_env(workspace, "")
    (workspace.parent / "home" / "private_notes.txt").write_text("PRIVATE-NOTES\n")
    server = serve(lambda body: reply("ok"))
    term = terminal(server, env={**env, "OPENROUTER_BASE_URL": server.url}, first=r"\(y yes · n no · Esc no\) ")
    term.send("\x1b")
    term.expect(r"^no\r\n")
    term.expect(PROMPT)
    term.ask("hi", "ok")
    assert "PRIVATE-NOTES" not in server.bodies[0]["messages"][0]["content"]
