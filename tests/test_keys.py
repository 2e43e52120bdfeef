"""Issue 33, faults 2, 4 and 1, on real pseudo-terminals: questions answered by one key (Esc is no), what is typed
during a turn shown on an input line under the status line (Enter queues it), and the terminal's size followed
(SIGWINCH) so nothing stale is left when it shrinks (tmux reads the screen)."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable

from tests.conftest import PROMPT, program_env
from tests.fake_openrouter import call, last_result, reply
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


# --- Fault 4: an input line under the status line -------------------------------------------------


def holding(release: threading.Event):
    """A model whose prompt "tell me" streams a first line, then waits for `release`; other prompts it answers."""
    def model(body):
        if user_turns(body)[-1] == "tell me":
            return held("first line\n", "last line", release)
        return reply(f"got {user_turns(body)[-1]!r}")
    return model


def test_keys_typed_during_a_turn_show_on_an_input_line_and_enter_queues_them(serve, terminal):
    release = threading.Event()
    server = serve(holding(release))
    term = terminal(server, term="xterm")
    term.send("tell me\r")
    term.expect("first line")
    term.expect(r"esc to interrupt\)\x1b\[0m\r\n\x1b\[90m› \x1b\[0m")  # an empty input line under the status line
    term.send("and th")
    term.expect(r"\r\n\x1b\[90m› \x1b\[0mand th")
    term.send("\x7f\x7fthen\r")
    term.expect(r"\r\n\x1b\[90mqueued: and then\x1b\[0m\r\n\x1b\[90m› \x1b\[0m")  # queued, the input line empty again
    term.send("gone\x15second\r")  # Ctrl-U empties the line
    term.expect(r"queued: and then\x1b\[0m\r\n\x1b\[90mqueued: second\x1b\[0m\r\n\x1b\[90m› \x1b\[0m")
    term.send("\r")  # Enter on an empty line queues nothing
    term.send("unfinished")
    term.expect(r"› \x1b\[0munfinished")
    release.set()
    term.expect("last line")
    term.expect(DRAWN_PROMPT + r"and then\r\n")  # the queued prompts run in order when the turn ends
    term.expect("got 'and then'")
    term.expect(DRAWN_PROMPT + r"second\r\n")
    term.expect("got 'second'")
    term.expect(DRAWN_PROMPT + r"(?:\x1b\[\?2004h)?unfinished")  # the unfinished line is the next prompt's, to edit
    term.send(" too\r")
    term.expect("got 'unfinished too'")
    assert [user_turns(body)[-1] for body in server.bodies] == ["tell me", "and then", "second", "unfinished too"]
    assert "gone" not in "".join(user_turns(server.bodies[-1]))
    term.expect(DRAWN_PROMPT)
    term.send("\x1b[A\x1b[A")  # the queued prompts are in the history too, each one entry
    term.expect("second")
    term.send("\x1b[A")
    term.expect("and then")


def test_on_a_dumb_terminal_a_queued_prompt_is_said_on_a_line_of_its_own(serve, terminal):
    release = threading.Event()
    server = serve(holding(release))
    term = terminal(server)
    term.send("tell me\r")
    term.expect("first line")
    term.send("next one\r")
    term.expect(r"\r\nqueued: next one\r\n")
    release.set()
    term.expect(r"\n> next one\r\n")
    term.expect("got 'next one'")
    assert "\x1b" not in term.transcript


# --- Fault 1: the terminal's size followed --------------------------------------------------------


SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
LONG = "sleep 30; echo a-command-long-enough-to-make-the-status-line-wide"


def status_drawn_at(columns: int) -> Callable[[list[str]], bool]:
    """Whether a screen shows the command's status line drawn for a width: cut at its edge, or whole where it fits."""
    return lambda rows: any(row[:1] and row[0] in SPINNER and "Bash(" in row and len(row) <= columns - 1 and (
        len(row) >= columns - 2 or row.endswith("esc to interrupt)")) for row in rows)  # a space cut at the edge


def test_resizing_the_window_during_a_turn_leaves_no_stale_status_line(serve, tmux):
    server = serve(lambda body: reply(tool_calls=[call("Bash", {"command": LONG})]))
    window = tmux(server, "--yes")
    window.wait(lambda rows: ">" in rows, "the prompt")
    window.send("-l", "go")
    window.send("Enter")
    window.wait(status_drawn_at(200), "the status line")
    window.send("-l", "typed text")
    window.wait(lambda rows: "› typed text" in rows, "the input line")
    for columns in (60, 30, 120, 45, 200):
        window.resize(columns)
        window.wait(status_drawn_at(columns), f"the status line at {columns} columns")
        rows = window.screen()
        status = [i for i, row in enumerate(rows) if row[:1] and row[0] in SPINNER]
        assert len(status) == 1, "\n".join(rows)  # no old status line left, whole or in part
        turn = max((i for i, row in enumerate(rows) if row == "> go"), default=-1) + 1  # the first screen's " · " above
        assert not [row for i, row in enumerate(rows) if turn <= i != status[0] and any(
            piece in row for piece in ("tokens", "interrupt", "...", " · "))], "\n".join(rows)
        assert status[0] == 0 or rows[status[0] - 1].endswith("wide)"), "\n".join(rows)  # under the command's line
        assert rows[status[0] + 1] == "› typed text" and not any(rows[status[0] + 2:]), "\n".join(rows)
    window.send("Escape")
    window.wait(lambda rows: "solo: cancelled" in rows, "the turn cancelled")


def todos(*states: str) -> list[dict]:
    """Three to-do items, two of them long enough to wrap at 40 columns, in these states."""
    items = ["Read every file of the project and note what each one does", "Write the summary of the architecture "
             "for newcomers", "Ship it"]
    return [{"content": item, "status": state, "activeForm": item} for item, state in zip(items, states)]


def test_a_to_do_list_drawn_before_a_resize_is_not_drawn_over_after_it(serve, tmux):
    """The list is drawn over its last drawing when nothing came below it, its rows counted; after a resize the
    terminal rewrapped those rows, so the new list goes below, and the old one is left whole."""
    release = threading.Event()

    def model(body):
        step = sum(m["role"] == "tool" for m in body["messages"])
        if step == 1:
            release.wait(20)  # the window is resized while the model thinks
        return reply(tool_calls=[call("TodoWrite", {"todos": todos(*[("in_progress", "pending", "pending"), (
            "completed", "in_progress", "pending")][step])})]) if step < 2 else reply("all done")

    server = serve(model)
    window = tmux(server, "--yes", width=120)
    window.wait(lambda rows: ">" in rows, "the prompt")
    window.send("-l", "plan")
    window.send("Enter")
    window.wait(lambda rows: "[ ] Ship it" in rows and any(row[:1] and row[0] in SPINNER for row in rows), "the list")
    window.resize(40)
    window.wait(lambda rows: any(row[:1] and row[0] in SPINNER and len(row) == 39 for row in rows), "a redraw")
    release.set()
    window.wait(lambda rows: "all done" in rows, "the answer")
    rows = [row for row in window.screen(history=True, joined=True) if row]
    first, second = [i for i, row in enumerate(rows) if row == "● To-do list"]
    assert rows[first + 1: first + 4] == ["[>] Read every file of the project and note what each one does",
                                          "[ ] Write the summary of the architecture for newcomers", "[ ] Ship it"]
    assert rows[second + 1: second + 4] == ["[x] Read every file of the project and note what each one does",
                                            "[>] Write the summary of the architecture for newcomers", "[ ] Ship it"]


def test_the_picker_is_redrawn_at_the_new_width_when_the_window_is_resized(serve, run, tmux, workspace):
    server = serve(lambda body: reply("answered"))
    home = {"SOLO_HOME": str(workspace.parent / "solo-home")}
    for fruit in ("apples", "pears", "plums"):
        assert run(["-p", f"a long question about {fruit} " + "and more " * 12], cwd=workspace, base_url=server.url,
                   env=home).code == 0
    window = tmux(server, width=150)
    window.wait(lambda rows: ">" in rows, "the prompt")
    window.send("-l", "/resume")
    window.send("Enter")
    rows = window.wait(lambda rows: any("question about plums" in row for row in rows), "the picker")
    assert max(map(len, rows)) > 60 and rows[0].startswith("Resume which")
    window.resize(50)  # no key: the resize alone redraws it
    rows = window.wait(lambda rows: rows[0].endswith("Esc):") and not rows[0].startswith("Resume"), "the picker at 50")
    assert all(len(row) <= 49 for row in rows) and any(row.startswith("❯ ") for row in rows), "\n".join(rows)
    window.send("Enter")
    window.wait(lambda rows: any(row.startswith("solo: resumed ") for row in rows), "the session resumed")


def test_a_prompt_queued_while_a_question_holds_the_screen_never_stops_the_question(workspace):
    """A question holds the display's lock while it stops the thread that reads keys; a prompt queued on a dumb
    terminal just then is said later, not waited for (that wait would never end)."""
    import io
    import pty
    import signal

    from app import main as agent
    master, slave = pty.openpty()
    winch = signal.getsignal(signal.SIGWINCH)
    try:
        with open(os.dup(slave), "w") as stderr:
            display = agent.Display(agent.Config(api_key="k", cwd=workspace), agent.Streams(
                io.StringIO(), io.StringIO(), stderr), {"TERM": "dumb"})
            keys = agent.Keys(slave, display, lambda *args: None)
            keys.start()
            with display.lock:  # as a question holds it
                os.write(master, b"next\r")
                deadline = time.monotonic() + 10
                while keys.kept != "next\n":
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                stopping = threading.Thread(target=keys.stop, daemon=True)
                stopping.start()
                stopping.join(10)
                assert not stopping.is_alive()
            keys.tell()
            assert "queued: next\r\n" in os.read(master, 4096).decode()
    finally:
        signal.signal(signal.SIGWINCH, winch)
        os.close(master)
        os.close(slave)
