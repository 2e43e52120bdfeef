"""The interactive session, driven on a real pseudo-terminal (stdlib pty) as a user would."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app import main as agent
from tests.conftest import PROMPT, screen_of
from tests.fake_openrouter import Stream, call, last_result, reply, tool_then


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


@pytest.mark.parametrize("args, colour", [((), False), (("--yes",), False), (("--yes",), True)],
                         ids=["default", "yes-dumb", "yes-xterm"])
def test_the_first_screen_shows_folder_model_mode_sandbox_and_keys(serve, terminal, workspace, args, colour):
    server = serve(lambda body: reply("hi"))
    term = terminal(server, *args, term="xterm" if colour else "dumb")
    shown = term.transcript.split("> ")[0]
    lines = [line for line in shown.split("\r\n") if line]
    assert lines[:2] == [f"solo {agent.VERSION} · model anthropic/claude-haiku-4.5", str(workspace)]  # the folder too long to join
    assert len(lines) == 4 and all(len(re.sub(r"\x1b\[[0-9;]*m", "", line)) < 80 for line in lines[2:])  # 80 columns
    assert "sandbox off" in shown
    for key in ("/help", "Esc", "Ctrl-O", "!", "@"):
        assert key in lines[-1]
    if args:  # nothing will be asked: a warning that shows, in red where there is colour
        assert "⚠ permissions bypassPermissions: nothing asks" in shown
        assert ("\x1b[31m⚠ permissions bypassPermissions" in shown) == colour
    else:
        assert "permissions default: asks before commands and edits · sandbox off" in shown and "⚠" not in shown
    term.send("\x04")
    assert term.wait() == 0


def test_a_confirmation_answered_n_runs_nothing(serve, terminal, workspace):
    server = serve(tool_then([call("Bash", {"command": "touch made"})], lambda body: "result: " + last_result(body)))
    term = terminal(server)
    term.send("make a file\r")
    term.expect(r"Bash wants to run:\r\ntouch made\r\nsolo: a: allow Bash\(touch:\*\) for this session; s: and save it "
                r"in \.claude/settings\.local\.json\r\nAllow Bash\? \[y/n/a/s\] ")
    term.send("n\r")
    term.expect("result: Error: permission denied: the user declined")
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
    term.expect(r"\[y/n/a/s\] ")
    term.send("a\r")
    term.expect("both made")
    assert (workspace / "f0").exists() and (workspace / "f1").exists()
    assert "Allow" not in term.seen
    term.expect("> ")  # Ctrl-D typed before the prompt would be lost, as for a person
    term.send("\x04")
    assert term.wait() == 0


def test_always_on_a_loop_offers_the_commands_it_runs_and_the_loop_then_runs_without_asking(serve, terminal,
                                                                                          workspace):
    loop = "for f in a b; do touch made; done"
    def model(body):
        if sum(1 for m in body["messages"] if m["role"] == "tool") < 2:
            return reply(tool_calls=[call("Bash", {"command": loop})])
        return reply("both ran")
    server = serve(model)
    term = terminal(server)
    term.send("go\r")
    shown = term.expect(r"\[y/n/a/s\] ")
    assert "a: allow Bash(touch:*) for this session;" in shown and not re.search(r"allow.*Bash\((for|do|done)\b", shown)
    term.send("a\r")
    term.expect("both ran")  # the second call of the same loop is allowed by that rule: no question
    assert "Allow" not in term.seen and (workspace / "made").exists()
    term.expect(PROMPT)
    term.send("\x04")
    assert term.wait() == 0


def test_an_edit_that_cannot_apply_fails_at_once_without_a_question(serve, terminal, workspace):
    """Issue 33: an Edit whose old_string is not in the file, or not once, or whose file is missing, is not asked
    about (its diff would be a lie): it fails at once; an Edit that applies is still asked about."""
    (workspace / "a.txt").write_text("one two two\n")
    edits = [{"file_path": "a.txt", "old_string": "three", "new_string": "3"},
             {"file_path": "a.txt", "old_string": "two", "new_string": "2"},
             {"file_path": "gone.txt", "old_string": "x", "new_string": "y"},
             {"file_path": "a.txt", "old_string": "one", "new_string": "1"}]

    def model(body):
        done = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if len(done) < len(edits):
            return reply(tool_calls=[call("Edit", edits[len(done)])])
        return reply("results: " + " | ".join(done))
    server = serve(model)
    term = terminal(server)
    term.send("go\r")
    shown = term.expect(r"Allow Edit\? \[y/n/a\] ")
    assert shown.count("Allow") == 1 and "change a.txt" in shown and "+1 two two" in shown
    term.send("n\r")
    term.expect("results: ")
    term.expect(PROMPT)
    results = [m["content"] for m in server.bodies[-1]["messages"] if m["role"] == "tool"]
    assert results[0].startswith("Error: old_string was not found in a.txt")
    assert results[1].startswith("Error: old_string was found 2 times in a.txt")
    assert results[2].startswith("Error: file not found: gone.txt")
    assert results[3].startswith("Error: permission denied: the user declined")  # only the last was asked about
    assert (workspace / "a.txt").read_text() == "one two two\n"


def test_ctrl_c_cancels_a_turn_and_returns_to_the_prompt(serve, terminal, workspace):
    def model(body):
        text = user_turns(body)[-1]
        if text == "slow" and body["messages"][-1]["role"] == "user":
            return reply(tool_calls=[call("Bash", {"command": "echo $$ > pid; sleep 60"})])
        return reply(f"quick answer to {text}; {len(body['messages'])} messages")
    server = serve(model)
    term = terminal(server)
    term.send("slow\r")
    term.expect(r"\[y/n/a/s\] ")
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
    term.expect(PROMPT)
    pid = int((workspace / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    term.send("\x03")  # Ctrl-C at an empty prompt only says how to leave
    term.expect("press Ctrl-C again to leave")
    term.expect(PROMPT)
    term.send("\x03")  # and a second one within a second leaves
    assert term.wait() == 0


def test_commands_help_cost_model_clear(serve, terminal):
    server = serve(lambda body: reply(f"{body['model']} sees {len(user_turns(body))}"))
    term = terminal(server)
    term.ask("/help", "/clear")
    term.ask("hello", "anthropic/claude-haiku-4.5 sees 1")
    term.ask("/cost", r"1 request, 100 prompt tokens .*\$0\.0010")
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


# --- The permission prompt shows what will really run, and only a typed answer answers it ----------


def asks_once(calls, answer="done"):
    """A model that makes these calls once, then answers with the last tool result."""
    return tool_then(calls, lambda body: f"{answer}: " + last_result(body))


def test_control_characters_are_shown_escaped_not_obeyed(serve, terminal, workspace):
    hidden = "touch pwned\r\x1b[2Kls -la"  # on a raw terminal this shows as just `ls -la`
    server = serve(asks_once([call("Bash", {"command": hidden})]))
    term = terminal(server)
    term.send("list\r")
    shown = term.expect(r"Allow Bash\? \[y/n/a/s\] ")
    assert r"touch pwned\r\x1b[2Kls -la" in shown and "\x1b" not in shown
    term.send("n\r")
    term.expect("done: Error: permission denied: the user declined")
    assert not (workspace / "pwned").exists()


def test_the_whole_command_is_shown_every_line(serve, terminal):
    command = "echo harmless\n" + "# padding " * 40 + "\nrm -rf ./important"
    server = serve(asks_once([call("Bash", {"command": command})]))
    term = terminal(server)
    term.send("go\r")
    shown = term.expect(r"Allow Bash\? \[y/n/a/s\] ")
    assert "echo harmless\r\n" in shown and "\r\nrm -rf ./important\r\n" in shown
    time.sleep(1.2)  # the time at the question is not the tool's
    term.send("n\r")
    assert float(re.search(r"⎿ Error: permission denied: .* \((\d+\.\d) s\)", term.expect(PROMPT)).group(1)) < 1.2


def test_file_changes_are_shown_as_a_bounded_diff(serve, terminal, workspace):
    (workspace / "conf.txt").write_text("mode = safe\nlevel = 1\n")
    big = "".join(f"line {i}\n" for i in range(200))
    server = serve(asks_once([call("Edit", {"file_path": "conf.txt", "old_string": "mode = safe",
                                            "new_string": "mode = unsafe"}),
                              call("Write", {"file_path": "big.txt", "content": big})]))
    term = terminal(server)
    term.send("change it\r")
    shown = term.expect(r"Allow Edit\? \[y/n/a\] ")
    assert "Edit wants to change conf.txt" in shown and "   1 -mode = safe\r\n   1 +mode = unsafe" in shown
    term.send("y\r")
    shown = term.expect(r"Allow Write\? \[y/n/a\] ")
    assert "+line 38\r\n" in shown and "+line 39" not in shown and "[... 161 more lines of the change not shown]" in shown
    term.send("n\r")
    term.expect(PROMPT)
    assert (workspace / "conf.txt").read_text() == "mode = unsafe\nlevel = 1\n" and not (workspace / "big.txt").exists()


def test_typed_ahead_text_does_not_answer_and_only_y_n_a_do(serve, terminal, workspace):
    release = threading.Event()

    def model(body):
        if body["messages"][-1]["role"] == "user":
            release.wait(10)  # the question cannot be asked before the test has typed ahead
            return reply(tool_calls=[call("Bash", {"command": "touch made"})])
        return reply("answer: " + last_result(body))

    server = serve(model)
    term = terminal(server)
    term.send("make it\r")
    deadline = time.monotonic() + 10
    while not server.bodies:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    term.send("a\r")  # typed while the model thinks: must not answer the question to come (it is the next prompt)
    term.expect(r"\r\nqueued: a\r\n")
    release.set()
    term.expect(r"Allow Bash\? \[y/n/a/s\] ")
    term.send("u")  # one key answers, and a key that is no answer asks again
    term.expect(r"Please answer y \(yes\), n \(no\), a \(always: Bash\(touch:\*\)\) or s \(save it\): ")
    term.send("\x04")  # Ctrl-D at the question means no
    term.expect("answer: Error: permission denied: the user declined")
    assert not (workspace / "made").exists()
    term.expect(r"\n> a\r\n")  # the line typed ahead was queued: the next prompt, asked about again
    term.expect(r"Allow Bash\? \[y/n/a/s\] ")
    assert user_turns(server.bodies[-1])[-1] == "a"
    term.send("n")
    term.expect("answer: Error: permission denied: the user declined")
    assert not (workspace / "made").exists()
    term.expect(PROMPT)
    term.send("\x1b[A\r")  # up-arrow recalls the last prompt (the queued "a"), never a permission answer ("n")
    term.expect(r"Allow Bash\? \[y/n/a/s\] ")
    assert user_turns(server.bodies[-1])[-1] == "a"
    term.send("n")
    term.expect(PROMPT)
    term.send("\x1b[A\x1b[A\r")  # and the one before it: the first prompt (the same prompt twice is one entry)
    term.expect(r"Allow Bash\? \[y/n/a/s\] ")
    assert user_turns(server.bodies[-1])[-1] == "make it"
    term.send("n")
    term.expect(PROMPT)


def test_a_pasted_block_of_lines_is_one_prompt(serve, terminal):
    server = serve(lambda body: reply(f"got {len(user_turns(body))} prompt(s)"))
    term = terminal(server)
    term.send("first line\rsecond line\rthird line\r")
    term.expect(r"got 1 prompt\(s\)")
    term.expect(PROMPT)
    assert user_turns(server.bodies[0]) == ["first line\nsecond line\nthird line"] and len(server.bodies) == 1


# --- Leaving and interrupting ----------------------------------------------------------------------


def test_ctrl_c_after_a_cancelled_turn_does_not_leave(serve, terminal, workspace):
    def model(body):
        if user_turns(body)[-1] == "slow" and body["messages"][-1]["role"] == "user":
            return reply(tool_calls=[call("Bash", {"command": "echo $$ > pid; sleep 60"})])
        return reply(f"still here, {len(user_turns(body))} prompt(s)")

    server = serve(model)
    term = terminal(server)
    term.send("slow\r")
    term.expect(r"\[y/n/a/s\] ")
    term.send("y\r")
    deadline = time.monotonic() + 10
    while not ((workspace / "pid").exists() and (workspace / "pid").read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    term.send("\x03")  # stops the command
    term.expect("cancelled")
    term.expect(PROMPT)
    term.send("\x03")  # a second Ctrl-C soon after, at the empty prompt: a hint, not an exit
    term.expect("press Ctrl-C again to leave")
    term.expect(PROMPT)
    term.send("half typed")
    term.expect("half typed")  # the line discipline drops what was not yet read when Ctrl-C arrives
    term.send("\x03")  # Ctrl-C with text typed clears the line and starts a new one
    term.expect(PROMPT)
    term.ask("next", r"still here, 1 prompt\(s\)")
    assert term.proc.poll() is None
    term.send("\x04")
    term.expect("\n")
    assert term.wait() == 0


def test_model_without_a_name_shows_it_and_no_thinking_note_on_a_dumb_terminal(serve, terminal):
    server = serve(lambda body: reply("hi"))
    term = terminal(server)
    term.ask("/model", "model: anthropic/claude-haiku-4.5")
    term.ask("hello", "hi")
    assert server.bodies and all(user_turns(b) == ["hello"] for b in server.bodies)  # /model was not sent
    assert "thinking" not in term.transcript and "\x1b[K" not in term.transcript
    term.send("/exit\r")
    assert term.wait() == 0


def test_model_name_is_checked_against_the_model_list_before_it_is_taken(serve, terminal):
    listed = [{"id": "anthropic/claude-haiku-4.5"}, {"id": "anthropic/claude-sonnet-4.5"}, {"id": "openai/gpt-5"}]
    server = serve(lambda body: reply(f"{body['model']} here"), models=listed)
    term = terminal(server)
    term.ask("/model claude-sonnet-4.5", "does not know the model claude-sonnet-4.5; did you mean "
                                         "anthropic/claude-sonnet-4.5")
    term.ask("/model xyzzy", r"does not know the model xyzzy \(model names look like anthropic/claude-sonnet-4\.5")
    term.ask("hello", "anthropic/claude-haiku-4.5 here")  # a refused name changes nothing
    term.ask("/model anthropic/claude-sonnet-4.5", "model: anthropic/claude-sonnet-4.5")
    term.send("/exit\r")
    assert term.wait() == 0


@pytest.mark.parametrize("flags", [(), ("--no-stream",)], ids=["streamed", "whole"])
def test_the_text_that_comes_with_a_tool_call_shows_before_the_call_streamed_or_not(serve, terminal, flags):
    def model(body):
        if body["messages"][-1]["role"] == "user":
            return reply("Let me look first.", tool_calls=[call("Glob", {"pattern": "*.md"})])
        return reply("All done.")
    term = terminal(serve(model), *flags)
    term.send("find the docs\r")
    assert "Let me look first.\r\n" in term.expect(r"Glob\(")
    term.expect("All done.")
    term.send("/exit\r")
    assert term.wait() == 0


def test_ctrl_c_while_a_finished_answer_prints_keeps_the_turn(serve, workspace):
    """In process: the answer's printing is interrupted; the turn it ends must stay in the conversation."""
    import io

    from app import main as agent
    server = serve(lambda body: reply(f"answer {len(user_turns(body))}"))
    cfg = agent.Config(api_key="k", cwd=workspace, base_url=server.url, tools=agent.TOOL_NAMES, stream=False)
    class Screen(io.StringIO):
        def isatty(self) -> bool:  # a session shows its prompts on a terminal
            return True

    session = agent.Session(cfg, {}, agent.Streams(io.StringIO(), io.StringIO(), Screen()))
    prompts, printed = ["first", "second"], []

    def next_prompt() -> str:
        if not prompts:
            raise EOFError
        return prompts.pop(0)

    def answer(text: str) -> None:
        printed.append(text)
        if len(printed) == 1:
            raise KeyboardInterrupt  # Ctrl-C lands while the first answer is being printed

    session.editor.read_prompt, session.reporter.answer = next_prompt, answer
    assert session.run() == 0
    assert printed == ["answer 1", "answer 2"]
    assert server.bodies[1]["messages"][1:] == [{"role": "user", "content": "first"},
                                                {"role": "assistant", "content": "answer 1"},
                                                {"role": "user", "content": "second"}]



def pager_env(server, pager: str) -> dict[str, str]:
    """The environment of a session against the fake server that pages with `pager`."""
    return {**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "k", "PAGER": pager}


def held(first: str, last: str, release: threading.Event, *then: Callable[[], Any]) -> Stream:
    """A streamed reply that sends `first`, waits for `release`, then ends with `last` (and runs `then`)."""
    return Stream([{"choices": [{"index": 0, "delta": {"content": first}}]}, lambda: release.wait(20),
                   {"choices": [{"index": 0, "delta": {"content": last}, "finish_reason": "stop"}]}, *then])


def test_words_show_as_they_stream_and_ctrl_c_cancels_the_stream_at_once(serve, terminal):
    release = threading.Event()

    def model(body):
        if user_turns(body)[-1] == "tell me":
            return held("first words ", "never shown", release)
        return reply(f"{len(body['messages'])} messages")

    server = serve(model)
    term = terminal(server)
    term.send("tell me\r")
    term.expect("first words ")  # on the screen while the reply is still coming
    assert not release.is_set()
    started = time.monotonic()
    term.send("\x03")
    term.expect("cancelled")
    term.expect(PROMPT)
    assert time.monotonic() - started < 5  # the connection was closed, not waited on (the reply waits 20 s)
    release.set()
    term.ask("again", "2 messages")  # system + this prompt: the cancelled turn is gone
    assert "never shown" not in term.transcript and "\x1b" not in term.transcript


# --- Seeing the work: tool lines, diffs, Markdown, the status line, Esc ---------------------------


DRAWN_PROMPT = r"(?:\n|\x1b\[K)> "  # at the start of a line, or after the status line was taken off it


def test_a_tool_line_shows_while_the_command_runs_then_how_it_ended_and_its_first_lines(serve, terminal, workspace):
    command = "echo started; while [ ! -f go ]; do sleep 0.05; done; seq 1 12; exit 3"
    server = serve(asks_once([call("Bash", {"command": command})]))
    env = pager_env(server, "cat")
    term = terminal(server, "--yes", term="xterm", env=env)
    term.send("run it\r")
    term.expect(r"Bash\(echo started; while")
    term.expect(r"Bash\(echo started.*\(\d+s · \d+ tokens · esc to interrupt\)")  # the status line, live, while it runs
    (workspace / "go").touch()
    shown = term.expect("done: ")
    assert re.search(r"⎿ \[exit code 3\]\x1b\[90m \(\d+\.\d s\)\x1b\[0m\r\n    started\r\n    1\r\n", shown)  # the cut hides the end
    assert "    6\r\n    … +6 lines (ctrl-o to expand)\r\n" in shown and "    7\r\n" not in shown
    term.expect(DRAWN_PROMPT)
    term.send("\x0f")  # Ctrl-O: the last result whole, through the pager
    term.expect(r"\r\n4\r\n5\r\n6\r\n7\r\n")
    term.expect(DRAWN_PROMPT)


def test_no_color_keeps_a_plain_status_line(serve, terminal, workspace):
    """Issue 33: NO_COLOR means no colour, not no progress: the spinner, seconds, tokens and "esc to interrupt" still
    show while a command runs, with no colour anywhere."""
    command = "echo started; while [ ! -f go ]; do sleep 0.05; done"
    server = serve(asks_once([call("Bash", {"command": command})]))
    term = terminal(server, "--yes", term="xterm", env={**pager_env(server, "cat"), "NO_COLOR": "1"})
    term.send("run it\r")
    term.expect(r"\r\x1b\[K(?:\x1b\[\?7l)?[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] Bash\(echo started.*\(\d+s · \d+ tokens · esc to interrupt\)")
    (workspace / "go").touch()
    term.expect("done: ")
    term.expect(DRAWN_PROMPT)
    assert not re.search(r"\x1b\[[0-9;]*m", term.transcript)  # not one colour


def test_an_accepted_edit_shows_a_coloured_diff_and_answers_render_as_markdown(serve, terminal, workspace):
    (workspace / "conf.txt").write_text("mode = safe\nlevel = 1\n")
    answer = ("# Title\nSome **bold** and `code`.\n- item\n```python\ndef f():  # note\n    return 'x'\n```\n"
              "| name | n |\n|---|---|\n| a | 10 |\n| bbb | 2 |\n")
    server = serve(tool_then([call("Edit", {"file_path": "conf.txt", "old_string": "mode = safe",
                                            "new_string": "mode = fast"}),
                              call("Write", {"file_path": "new.txt", "content": "hello\n"})], answer))
    term = terminal(server, "--permission-mode", "acceptEdits", term="xterm")
    term.send("change it\r")
    shown = term.expect(r"\| bbb|bbb")
    assert "changed conf.txt" in shown and "--- conf.txt\r\n    +++ conf.txt" in shown
    assert "\x1b[31m   1 -mode = safe\x1b[0m" in shown and "\x1b[32m   1 +mode = fast\x1b[0m" in shown
    assert "created new.txt" in shown and "--- /dev/null" in shown and "\x1b[32m   1 +hello\x1b[0m" in shown
    assert "\x1b[1;4mTitle\x1b[0m" in shown and "\x1b[1mbold\x1b[0m" in shown and "\x1b[36mcode\x1b[0m" in shown
    assert "• item" in shown and "╭─ python" in shown and "\x1b[35mdef\x1b[0m f():  \x1b[90m# note\x1b[0m" in shown
    assert "\x1b[32m'x'\x1b[0m" in shown
    term.expect(DRAWN_PROMPT)
    drawn = screen_of(term.transcript)  # the raw text shows as it streams, then its lines are drawn over it
    assert "**" not in drawn and "```" not in drawn and "|" not in drawn
    table = [line for line in drawn.split("\n") if "│" in line or "┼" in line]
    assert table[-4:] == ["name │ n", "─────┼───", "a    │ 10", "bbb  │ 2"]


def test_esc_interrupts_a_turn_and_keys_typed_meanwhile_start_the_next_prompt(serve, terminal):
    release = threading.Event()

    def model(body):
        if user_turns(body)[-1] == "tell me":
            return held("first line\n", "never", release)
        return reply(f"got {user_turns(body)[-1]!r} after {len(body['messages'])} messages")

    server = serve(model)
    term = terminal(server, term="xterm")
    term.send("tell me\r")
    term.expect("first line")
    term.send("and then")  # typed during the turn: shown on the input line under the status line, kept
    term.expect(r"› \x1b\[0mand then")
    term.send("\x1b")
    term.expect("cancelled")
    term.expect(DRAWN_PROMPT)
    term.send(" more\r")
    term.expect(r"got 'and then more' after 2 messages")
    release.set()
    typed = term.transcript.split("cancelled")[0].split("and then")[:-1]
    assert typed and all(before.endswith("› \x1b[0m") for before in typed)  # never echoed over the status line


# --- Typing less: /commands, !, #, @, custom commands, Tab, history ---------------------------------


def test_unknown_commands_bang_hash_and_at_mentions(serve, terminal, workspace):
    (workspace / "notes.txt").write_text("the notes say 42\n")
    server = serve(lambda body: reply(f"seen {len(body['messages'])}"))
    term = terminal(server)
    term.ask("/hepl", r"unknown command /hepl: did you mean /help\?")
    term.ask("!echo from-the-shell", "from-the-shell")
    term.send("#always run the tests\r")
    term.expect(r"Add this line to ./CLAUDE.md\? \[y/n\] ")
    term.ask("y", "added to")
    term.ask("read @notes.txt please", "seen 2")
    assert not server.bodies[1:]  # /hepl, ! and # sent nothing of their own
    sent = user_turns(server.bodies[0])[-1]
    assert sent.startswith("I ran this command myself:\n$ echo from-the-shell\nfrom-the-shell")
    assert sent.endswith('read @notes.txt please\n\n<file path="notes.txt">\nthe notes say 42\n</file>')
    assert (workspace / "CLAUDE.md").read_text() == "always run the tests\n"
    term.ask("/init", "seen")
    assert "CLAUDE.md" in user_turns(server.bodies[-1])[-1]


CUSTOM = """---
description: Greet someone
argument-hint: NAME
model: anthropic/claude-haiku-other
allowed-tools: Bash
---
Greet $1 ($ARGUMENTS). Shell says: !`echo inlined-$1`
See @facts.txt
"""


def test_custom_commands_run_in_a_session_with_tab_and_in_p(serve, terminal, workspace, run):
    (workspace / ".claude" / "commands").mkdir(parents=True)
    (workspace / ".claude" / "commands" / "greet.md").write_text(CUSTOM)
    (workspace / "facts.txt").write_text("fact one\n")
    server = serve(lambda body: reply(f"{body['model']} done"))
    result = run(["-p", "/greet Bob smith"], cwd=workspace, base_url=server.url)
    assert result.code == 0 and result.stdout == "anthropic/claude-haiku-other done\n"
    assert result.stderr == ""  # with -p nothing asks: a command's grant is moot, and no line says it waits
    sent = user_turns(server.bodies[-1])[-1]
    assert sent.startswith("Greet Bob (Bob smith). Shell says: inlined-Bob\nSee @facts.txt")
    assert '<file path="facts.txt">\nfact one\n</file>' in sent
    term = terminal(server, first=r"\[y/n\] ")  # the project's command grants Bash: that waits for the user's trust
    assert "custom commands in" in term.transcript and '/greet: ["Bash"]' in term.transcript
    term.send("y\r")
    term.expect(PROMPT)
    term.ask("/help", r"/greet NAME +Greet someone")
    term.send("/gre\t")
    term.expect("/greet")
    term.ask(" Ann", "anthropic/claude-haiku-other done")  # allowed-tools: Bash runs the !`command` without a question
    assert user_turns(server.bodies[-1])[-1].startswith("Greet Ann (Ann). Shell says: inlined-Ann")
    term.ask("next", "anthropic/claude-haiku-4.5 done")  # the command's model was for its prompt only


SETUP = """---
description: Set the project up
allowed-tools: Bash
---
Setting up: !`touch {proof} && echo set-up-ran`
"""


def test_an_untrusted_projects_command_grants_nothing_its_lines_ask(serve, terminal, workspace):
    """Issue 29: a repository's .claude/commands/setup.md with allowed-tools: Bash ran its !`line` at once, with no
    question, when the user typed /setup in a default-mode session. Declined trust: the line asks like any command."""
    proof = workspace.parent / "proof"
    (workspace / ".claude" / "commands").mkdir(parents=True)
    (workspace / ".claude" / "commands" / "setup.md").write_text(SETUP.format(proof=proof))
    server = serve(lambda body: reply("done"))
    term = terminal(server, first=r"\[y/n\] ")
    term.send("n\r")
    term.expect(PROMPT)
    term.send("/setup\r")
    term.expect(r"Allow Bash\? \[y/n/a/s\] ")  # asked, as any command is
    assert not proof.exists()
    term.send("n\r")
    term.expect("done")
    term.expect(PROMPT)
    assert not proof.exists() and "was not run" in user_turns(server.bodies[-1])[-1]
    term.send("/exit\r")
    assert term.wait() == 0


def test_the_users_own_command_wins_a_name_clash_with_the_projects(serve, run, workspace):
    proof = workspace.parent / "proof"
    (workspace / ".claude" / "commands").mkdir(parents=True)
    (workspace / ".claude" / "commands" / "setup.md").write_text(SETUP.format(proof=proof))
    mine = workspace.parent / "home" / ".claude" / "commands"
    mine.mkdir(parents=True)
    (mine / "setup.md").write_text("My own setup steps.\n")
    server = serve(lambda body: reply("done"))
    result = run(["-p", "/setup"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "done\n"), result.stderr
    assert user_turns(server.bodies[-1])[-1] == "My own setup steps." and not proof.exists()
    assert result.stderr == ""  # the project's shadowed command asks nothing of the user


def test_prompt_history_is_kept_per_project_across_sessions(serve, terminal, workspace):
    server = serve(lambda body: reply(f"answer to {user_turns(body)[-1]}"))
    term = terminal(server)
    term.ask("first prompt", "answer to first prompt")
    term.send("\x04")
    assert term.wait() == 0
    term = terminal(server)
    term.send("\x1b[A\r")  # up-arrow in a new session recalls the last one's prompt
    term.expect("answer to first prompt")
    history = next((Path(os.environ["HOME"]) / ".solo" / "projects").glob("*/history"))
    assert history.stat().st_mode & 0o777 == 0o600 and "first prompt" in history.read_text()


# --- Undo: checkpoints, /rewind, resuming ----------------------------------------------------------


def test_rewind_restores_files_and_conversation_and_survives_a_resume(serve, terminal, workspace):
    (workspace / "a.txt").write_text("original\n")

    def model(body):
        prompt = user_turns(body)[-1]
        if body["messages"][-1]["role"] == "user" and prompt in ("one", "two"):
            calls = [call("Write", {"file_path": "a.txt", "content": f"by {prompt}\n"})] + \
                [call("Write", {"file_path": "b.txt", "content": "new\n"})] * (prompt == "one")
            return reply(tool_calls=calls)
        return reply(f"did {prompt} with {len(body['messages'])} messages")

    server = serve(model)
    term = terminal(server, "--yes")
    term.ask("one", "did one")
    term.ask("two", "did two")
    assert (workspace / "a.txt").read_text() == "by two\n"
    term.send("\x04")
    assert term.wait() == 0
    term = terminal(server, "--yes", "-c", first="resumed [0-9a-f-]+: 10 messages")
    term.expect("did two")  # the last exchange is shown
    term.expect(PROMPT)
    term.send("\x1b\x1b")  # Esc Esc at an empty prompt: /rewind, at once even with Debian's inputrc ("\e\e[C")
    term.expect(r"1\. two  \[1 file changed since\]\r\nsolo:  2\. one  \[2 files changed since\]")  # the latest first
    term.expect(r"Go back to before which prompt \(1-2\)\? ")
    term.send("2\r")
    term.expect(r"conversation \(c\), the files \(f\) or both \(b\)\? ")
    term.send("b\r")
    term.expect("Files changed by commands")
    term.expect(PROMPT)
    assert (workspace / "a.txt").read_text() == "original\n" and not (workspace / "b.txt").exists()
    term.send("\r")  # the prompt rewound to is back in the line
    term.expect("did one with 5 messages")


def test_rewind_starts_at_the_latest_prompt_so_enter_rewinds_only_the_last(serve, terminal, workspace):
    """The picker's mark is on the latest prompt at first: Enter, then b, undoes the last prompt alone."""
    def model(body):
        prompt = user_turns(body)[-1]
        if body["messages"][-1]["role"] == "user" and prompt in ("one", "two"):
            return reply(tool_calls=[call("Write", {"file_path": "a.txt", "content": f"by {prompt}\n"})])
        return reply(f"did {prompt} with {len(body['messages'])} messages")

    server = serve(model)
    term = terminal(server, "--yes", term="xterm")
    for prompt in ("one", "two"):
        term.send(f"{prompt}\r")
        term.expect(f"did {prompt}")
        term.expect(DRAWN_PROMPT)
    term.send("/rewind\r")
    rows = picker(term, "Go back to before which prompt (2/2; type to narrow, ↑↓, Enter, Esc): ")
    assert rows[1].startswith("❯ two") and rows[2].startswith("  one")
    term.send("\r")
    term.expect(r"conversation \(c\), the files \(f\) or both \(b\)\? ")
    term.send("b\r")
    term.expect("Files changed by commands")
    term.expect(DRAWN_PROMPT)
    assert (workspace / "a.txt").read_text() == "by one\n"
    term.send("\r")  # "two" is back in the line
    term.expect("did two with 8 messages")  # "one"'s 4 are kept: only the last prompt was undone
    assert user_turns(server.bodies[-1]) == ["one", "two"]


def six_files(body: dict) -> dict:
    """A model whose prompt "make X" writes X.txt, and which summarises when asked to compact."""
    if body["messages"][0]["content"] == agent.SUMMARY_SYSTEM:
        return reply("the user had a.txt to e.txt made")
    prompt = user_turns(body)[-1]
    if body["messages"][-1]["role"] == "user" and prompt.startswith("make "):
        return reply(tool_calls=[call("Write", {"file_path": f"{prompt[5]}.txt", "content": f"made by {prompt}\n"})])
    return reply(f"did {prompt}")


def rewind_to(term, prompt: str, what: str) -> str:
    """Esc Esc, pick the row of `prompt` by its number, restore `what`; what the list showed."""
    term.send("/rewind\r")
    shown = term.expect(r"Go back to before which prompt \(1-\d+\)\? ")
    term.send(re.search(rf"(\d+)\. {prompt}", shown).group(1) + "\r")
    term.expect(r"conversation \(c\), the files \(f\) or both \(b\)\? ")
    term.send(f"{what}\r")
    return shown + term.expect(PROMPT)


@pytest.mark.parametrize("resume", [[], [["-c"]], [["-c", "--fork-session"], ["-c"]]])
def test_rewind_after_a_compaction_touches_only_the_files_since_the_chosen_prompt(serve, terminal, workspace, resume):
    """Checkpoints name their prompt by an identity that compaction, a resume and a fork keep: rewinding to before
    prompt 6 puts back f.txt alone, never the files of prompts 1 to 5, which compaction moved."""
    server = serve(six_files)
    term = terminal(server, "--yes")
    for letter in "abcde":
        term.ask(f"make {letter}", f"did make {letter}")
    term.send("/compact\r")
    term.expect(PROMPT)
    term.ask("make f", "did make f")
    for args in resume:  # then the fork is resumed in its turn: its transcript has the checkpoints too
        term.send("\x04")
        assert term.wait() == 0
        term = terminal(server, "--yes", *args, first="resumed [0-9a-f-]+: ")
        term.expect(PROMPT)
    shown = rewind_to(term, "make f", "f")
    assert re.search(r"\d+\. make f  \[1 file changed since\]", shown), shown
    assert "restored: " + str(workspace / "f.txt") in shown
    assert sorted(p.name for p in workspace.glob("*.txt")) == ["a.txt", "b.txt", "c.txt", "d.txt", "e.txt"]
    assert all((workspace / f"{x}.txt").read_text() == f"made by make {x}\n" for x in "abcde")
    shown = rewind_to(term, re.escape("[This conversation was compacted"), "f")  # the summary stands for prompt 5
    assert re.search(r"\d+\. \[This conversation was compacted.*  \[2 files changed since\]", shown), shown
    assert sorted(p.name for p in workspace.glob("*.txt")) == ["a.txt", "b.txt", "c.txt", "d.txt"]
    term.send("\x04")
    assert term.wait() == 0


def test_rewind_removes_the_folders_a_prompt_made_and_makes_again_one_a_command_deleted(serve, terminal, workspace):
    (workspace / "docs").mkdir()
    (workspace / "docs" / "readme.txt").write_text("original\n")
    calls = [call("Write", {"file_path": "docs/readme.txt", "content": "changed\n"}),
             call("Write", {"file_path": "new/deep/x.txt", "content": "x\n"}),
             call("Write", {"file_path": "new/y.txt", "content": "y\n"}), call("Bash", {"command": "rm -r docs"})]
    server = serve(lambda body: reply(tool_calls=calls) if body["messages"][-1]["role"] == "user" else reply("done"))
    term = terminal(server, "--yes")
    term.ask("go", "done")
    assert not (workspace / "docs").exists() and (workspace / "new" / "deep" / "x.txt").exists()
    shown = rewind_to(term, "go", "f")
    assert f"removed the folders it made: {workspace / 'new'}" in shown.replace("\r\n", " ")
    assert (workspace / "docs" / "readme.txt").read_text() == "original\n"
    assert sorted(p.name for p in workspace.iterdir()) == ["app", "docs"]


def test_rewind_keeps_a_folder_it_made_where_a_file_was_put_since(tmp_path):
    said: list[str] = []
    (tmp_path / "made" / "inner").mkdir(parents=True)
    (tmp_path / "made" / "inner" / "new.txt").write_text("new")
    (tmp_path / "made" / "yours.txt").write_text("put there since")
    session = type("S", (), {"reporter": type("R", (), {"say": staticmethod(said.append)})(), "checkpoints": [
        {"prompt_id": 1, "path": str(tmp_path / "made" / "inner" / "new.txt"), "exists": False, "bytes": None,
         "folder": str(tmp_path / "made")}]})()
    agent.Commands.restore(session, 1)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["made", "made/yours.txt"]
    assert said[0].startswith(f"restored: {tmp_path}/made/inner/new.txt. Files changed by commands")


def test_rewind_restores_notebooks_byte_for_byte_after_a_resume_even_deleted_or_symlinked(serve, terminal, workspace):
    cell = {"cell_type": "code", "execution_count": 1, "id": "c1", "metadata": {}, "outputs": [], "source": ["x = 1"]}
    original = json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n"
    for name in ("nb.ipynb", "gone.ipynb"):
        (workspace / name).write_text(original)
    outside = workspace.parent / "outside.txt"
    outside.write_text("precious\n")

    def model(body):
        prompt = user_turns(body)[-1]
        edit = {"cell_id": "c1", "new_source": f"x = '{prompt}'"}
        calls = {"one": [call("NotebookEdit", {"notebook_path": "nb.ipynb", **edit}),
                         call("NotebookEdit", {"notebook_path": "gone.ipynb", "file_path": "decoy.txt", **edit}),
                         call("Write", {"file_path": "new.ipynb", "content": original}),
                         call("NotebookEdit", {"notebook_path": "new.ipynb", **edit})],
                 "two": [call("NotebookEdit", {"notebook_path": "nb.ipynb", **edit})]}
        if body["messages"][-1]["role"] == "user" and prompt in calls:
            return reply(tool_calls=calls[prompt])
        return reply(f"did {prompt}")

    server = serve(model)
    term = terminal(server, "--yes")
    term.ask("one", "did one")
    term.ask("two", "did two")
    assert "x = 'two'" in (workspace / "nb.ipynb").read_text() and "x = 'one'" in (workspace / "new.ipynb").read_text()
    term.send("\x04")
    assert term.wait() == 0
    (workspace / "nb.ipynb").unlink()
    (workspace / "nb.ipynb").symlink_to(outside)  # replaced by a symlink: restoring must not write through it
    (workspace / "gone.ipynb").unlink()
    term = terminal(server, "--yes", "-c", first="resumed [0-9a-f-]+: ")
    term.expect(PROMPT)
    term.send("/rewind\r")
    term.expect(r"2\. one  \[3 files changed since\]")
    term.expect(r"Go back to before which prompt \(1-2\)\? ")
    term.send("2\r")
    term.expect(r"conversation \(c\), the files \(f\) or both \(b\)\? ")
    term.send("f\r")
    term.expect("Files changed by commands")
    term.expect(PROMPT)
    for name in ("nb.ipynb", "gone.ipynb"):
        assert not (workspace / name).is_symlink() and (workspace / name).read_bytes() == original.encode()
    assert not (workspace / "new.ipynb").exists() and outside.read_text() == "precious\n"
    term.send("\x04")
    assert term.wait() == 0


def test_rewind_says_which_files_it_could_not_put_back(tmp_path):
    said: list[str] = []
    (tmp_path / "now-a-folder").mkdir()
    session = type("S", (), {"reporter": type("R", (), {"say": staticmethod(said.append)})(), "checkpoints": [
        {"prompt_id": 1, "path": str(tmp_path / "now-a-folder"), "exists": True, "bytes": "old"},
        {"prompt_id": 1, "path": str(tmp_path / "big"), "exists": True, "bytes": None},
        {"prompt_id": 1, "path": str(tmp_path / "made"), "exists": False, "bytes": None}]})()
    agent.Commands.restore(session, 0)
    assert said == [(f"restored: {tmp_path}/made; not restored: {tmp_path}/big (too large to keep), {tmp_path}/"
                     "now-a-folder (Is a directory). Files changed by commands (Bash) are not tracked and were not "
                     "restored.")]


def test_rewind_never_writes_through_a_folder_put_in_a_symlink_s_place(tmp_path):
    """A checkpoint names a file by its real path: a folder of it that is now a symlink (a command can make one where
    the sandbox lets no file be written) is not followed out of the project."""
    said: list[str] = []
    (tmp_path / "outside").mkdir()
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "sub").symlink_to(tmp_path / "outside")
    session = type("S", (), {"reporter": type("R", (), {"say": staticmethod(said.append)})(), "checkpoints": [
        {"prompt_id": 1, "path": str(tmp_path / "project" / "sub" / "keys"), "exists": True, "bytes": "planted"},
        {"prompt_id": 1, "path": str(tmp_path / "project" / "sub" / "made"), "exists": False, "bytes": None}]})()
    (tmp_path / "outside" / "made").write_text("theirs")
    agent.Commands.restore(session, 0)
    assert sorted(p.name for p in (tmp_path / "outside").iterdir()) == ["made"]
    assert (tmp_path / "outside" / "made").read_text() == "theirs"
    assert said[0].startswith("restored: no file; not restored: ") and "a symlink is in the place of" in said[0]


def test_the_resume_picker_hides_this_session_puts_failed_runs_last_and_filters(serve, terminal, workspace, run):
    server = serve(tool_then([call("Read", {"file_path": "missing.txt"})], "answered"))
    home = {"SOLO_HOME": str(workspace.parent / "solo-home")}
    assert run(["-p", "alpha question", "--max-turns", "1"], cwd=workspace, base_url=server.url, env=home).code == 3
    assert run(["-p", "beta question"], cwd=workspace, base_url=server.url, env=home).code == 0
    term = terminal(server, env={**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "k", **home})
    term.ask("gamma question", "answered")
    term.send("/resume\r")
    shown = term.expect(r"Resume which \(1-2\)\? ")
    assert re.search(r" 1\. \w+ .*beta question\r\n.* 2\. \w+ .*alpha question \(ended without an answer\)", shown)
    assert "gamma" not in shown  # the session itself is not offered
    term.send("alpha\r")
    shown = term.expect(r"Resume which \(1-1\)\? ")
    assert "beta" not in shown
    term.send("1\r")
    term.expect(r"resumed [0-9a-f-]+: 4 messages")
    term.expect(PROMPT)


def test_the_status_line_tick_never_waits_for_a_question_on_another_thread(workspace):
    """A question holds the display's lock while it stops the thread that ticks: the tick must not wait for it."""
    import io

    from app import main as agent
    display = agent.Display(agent.Config(api_key="k", cwd=workspace), agent.Streams(io.StringIO(), io.StringIO(),
                                                                                   io.StringIO()), {"TERM": "xterm"})
    display.working("thinking")
    asking, answered = threading.Event(), threading.Event()

    def question() -> None:
        with display.lock:
            asking.set()
            answered.wait(10)

    threading.Thread(target=question, daemon=True).start()
    assert asking.wait(10)
    ticked = threading.Thread(target=display.draw, daemon=True)
    ticked.start()
    ticked.join(5)
    answered.set()
    assert not ticked.is_alive()


def test_the_status_line_follows_the_terminal_s_width_after_a_resize(workspace):
    import fcntl
    import io
    import pty
    import struct
    import termios
    master, slave = pty.openpty()

    def size(columns: int) -> None:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))

    def drawn() -> str:  # the status line drawn last (with wrapping off, so it can never spill onto a second row)
        display.draw()
        return os.read(master, 4096).decode().rsplit("\033[?7l", 1)[1].split("\033[?7h")[0]

    size(100)
    with open(slave, "w", closefd=True) as stderr:
        display = agent.Display(agent.Config(api_key="k", cwd=workspace), agent.Streams(
            io.StringIO(), io.StringIO(), stderr), {"TERM": "xterm", "NO_COLOR": "1"})
        display.fancy, display.activity, display.since = True, "x" * 40, time.monotonic()
        assert len(drawn()) > 70
        size(30)
        assert len(re.sub(r"\033\[[0-9;]*m", "", drawn())) == 29  # cut at the new edge, not the old one
    os.close(master)


PAGER = """#!/bin/sh
cat
while :; do set -- $(cat /proc/$$/stat); [ "$5" = "$8" ] && break; sleep 0.01; done  # its group is the foreground
echo "the pager has the terminal"
read line < /dev/tty
echo "the pager got $line"
"""


def test_ctrl_o_in_a_turn_lends_the_terminal_to_the_pager_and_the_turn_goes_on_after(serve, terminal, tmp_path):
    (tmp_path / "pager").write_text(PAGER)
    (tmp_path / "pager").chmod(0o755)
    asked, release, sent = threading.Event(), threading.Event(), threading.Event()

    def model(body):
        if user_turns(body)[-1] != "go":
            return reply(f"next: {user_turns(body)[-1]}")
        if body["messages"][-1]["role"] == "user":
            asked.wait(20)  # no tool has run before the test has pressed Ctrl-O
            return reply(tool_calls=[call("Bash", {"command": "seq 1 30"})])
        return held("while the pager\n", "the end", release, sent.set)

    server = serve(model)
    env = pager_env(server, str(tmp_path / "pager"))
    term = terminal(server, "--yes", term="xterm", env=env)
    term.send("go\r")
    deadline = time.monotonic() + 10
    while not server.bodies:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    term.send("\x0f")
    term.expect("no tool has run yet")
    asked.set()
    term.expect("while the pager")  # the command ran; the reply waits
    term.send("\x0f")
    shown = term.expect("the pager has the terminal")
    assert "Bash(seq 1 30)\r\n1\r\n2\r\n" in shown and "\r\n29\r\n30\r\n" in shown
    term.send("q\r")  # the pager reads the terminal: it has it, not the turn
    term.expect("the pager got q")
    term.send("\x0f")  # again, and the turn ends while the pager has the terminal
    term.expect("the pager has the terminal")
    release.set()
    assert sent.wait(10)
    term.send("\x03")  # Ctrl-C goes to the pager, not to the turn
    term.expect("the end")
    term.expect(DRAWN_PROMPT)
    assert "cancelled" not in term.transcript
    assert term.transcript.index("the end") > term.transcript.rindex("the pager has the terminal")
    term.send("more\r")  # the terminal is the prompt's again
    term.expect("next: more")
    term.expect(DRAWN_PROMPT)
    assert user_turns(server.bodies[-1]) == ["go", "more"]


@pytest.mark.parametrize("pager, said", [("/nonexistent/pager", "cannot run the pager '/nonexistent/pager': No such file"),
                                         ("false", "the pager 'false' ended with exit code 1")])
def test_a_pager_that_fails_is_said_and_the_session_goes_on(serve, terminal, pager, said):
    server = serve(asks_once([call("Bash", {"command": "echo the-output"})]))
    env = pager_env(server, pager)
    term = terminal(server, "--yes", env=env)
    term.ask("run it", "done: the-output")
    term.send("/expand\r")
    shown = term.expect(PROMPT)
    assert said in shown and ("the-output" in shown) == pager.startswith("/")  # shown here when none could start
    term.send("/exit\r")
    assert term.wait() == 0


def picker(term, head: str) -> list[str]:
    """The lines of the picker's screen, colours taken off, once its first line reads `head` (a screen is drawn whole
    from the top left, and ends with the cursor put back after the words typed)."""
    shown = term.expect(re.escape(head) + r"[^\n]*?(?:\n[^\n]*?)*?\x1b\[1;\d+H")
    return re.sub(r"\x1b\[[0-9;]*[mH]", "", shown.rsplit("\x1b[H\x1b[J", 1)[1]).split("\r\n")


@pytest.mark.parametrize("colour", [True, False], ids=["colour", "NO_COLOR"])
def test_the_resume_picker_narrows_the_list_at_each_key_typed_and_widens_it_at_backspace(serve, terminal, workspace,
                                                                                         run, colour):
    server = serve(tool_then([call("Read", {"file_path": "missing.txt"})], "answered"))
    home = {"SOLO_HOME": str(workspace.parent / "solo-home")}
    assert run(["-p", "alpha question", "--max-turns", "1"], cwd=workspace, base_url=server.url, env=home).code == 3
    for prompt in ("beta question", "gamma question"):
        assert run(["-p", prompt], cwd=workspace, base_url=server.url, env=home).code == 0
    env = {**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "k", **home}
    env = env if colour else {**env, "NO_COLOR": "1"}
    term = terminal(server, term="xterm", env=env)
    term.send("/resume\r")
    head = "Resume which ({}/3; type to narrow, ↑↓, Enter, Esc): {}"
    rows = picker(term, head.format(3, ""))
    assert [row[:2] for row in rows[1:]] == ["❯ ", "  ", "  "] and "gamma question" in rows[1]
    assert rows[3].endswith("alpha question (ended without an answer)")
    term.send("al")  # typed at once: the list is drawn for both keys
    assert [row for row in picker(term, head.format(1, "al"))[1:] if row] == [rows[3].replace("  ", "❯ ", 1)]
    term.send("\x7f\x7f")  # Backspace widens it again
    assert picker(term, head.format(3, "")) == rows
    term.send("quest\x1b[B")  # the arrow moves the mark: beta
    assert [row[:2] for row in picker(term, head.format(3, "quest"))[1:]] == ["  ", "❯ ", "  "]
    term.send("\r")
    term.expect(r"resumed [0-9a-f-]+: 5 messages")
    term.expect("▸ beta question")
    term.expect(DRAWN_PROMPT)
    assert ("\x1b[36m❯" in term.transcript) == colour
    for key, said in (("\x1b", "nothing was chosen"), ("\x03", "cancelled")):  # Esc and Ctrl-C pick none
        term.send("/resume\r")
        picker(term, head.format(2, "").replace("/3", "/2"))  # beta, the session now, is not offered
        term.send(key)
        term.expect(said)
        term.expect(DRAWN_PROMPT)
    term.send("next\r")  # the prompt reads lines again
    term.expect("answered")
    assert user_turns(server.bodies[-1]) == ["beta question", "next"]


@pytest.mark.parametrize("term_name", ["xterm", "dumb"])
def test_resume_narrows_on_any_prompt_of_a_session_not_only_its_first_and_last(serve, terminal, workspace, term_name):
    server = serve(lambda body: reply(f"answered {user_turns(body)[-1]}"))
    env = {**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "k",
           "SOLO_HOME": str(workspace.parent / "solo-home")}
    for prompts in (["apples first", "the middle kiwi prompt", "apples last"], ["plums first", "plums last"]):
        term = terminal(server, env=env)
        for prompt in prompts:
            term.ask(prompt, f"answered {prompt}")
        term.send("\x04")
        assert term.wait() == 0
    term = terminal(server, env=env, term=term_name)
    term.send("/resume\r")
    if term_name == "xterm":
        picker(term, "Resume which (2/2; type to narrow, ↑↓, Enter, Esc): ")
        term.send("kiwi")  # in neither the first nor the last prompt of its session
        rows = [row for row in picker(term, "Resume which (1/2; type to narrow, ↑↓, Enter, Esc): kiwi")[1:] if row]
        assert len(rows) == 1 and rows[0].startswith("❯ ") and "apples first … apples last" in rows[0]
    else:
        term.expect(r"Resume which \(1-2\)\? ")
        term.send("kiwi\r")
        assert "plums" not in term.expect(r"Resume which \(1-1\)\? ")
        term.send("1")
    term.send("\r")
    term.expect(r"resumed [0-9a-f-]+: 7 messages")
    term.expect("answered apples last")


def test_the_resume_picker_fits_a_small_terminal_and_is_redrawn_when_it_is_resized(serve, terminal, workspace, run):
    import fcntl
    import struct
    import termios
    server = serve(lambda body: reply("answered"))
    home = {"SOLO_HOME": str(workspace.parent / "solo-home")}
    for fruit in ("apples", "pears", "plums", "figs", "dates"):
        assert run(["-p", f"a long question about {fruit}"], cwd=workspace, base_url=server.url, env=home).code == 0
    term = terminal(server, term="xterm", env={**os.environ, "OPENROUTER_BASE_URL": server.url,
                                               "OPENROUTER_API_KEY": "k", **home})
    fcntl.ioctl(term.master, termios.TIOCSWINSZ, struct.pack("HHHH", 4, 24, 0, 0))  # 4 lines of 24 columns
    term.send("/resume\r")
    rows = picker(term, "Esc): ")
    assert len(rows) == 4 and all(len(row) <= 23 for row in rows)  # 3 of the 5 rows, cut at the edge
    term.send("plums long")
    rows = picker(term, "Esc): plums long")  # the start of the question gives way to the words typed
    assert rows[0] == "Enter, Esc): plums long" and rows[1:] == ["❯ " + rows[1][2:]] and len(rows[1]) == 23
    fcntl.ioctl(term.master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    rows = picker(term, "Resume which (1/5; type to narrow, ↑↓, Enter, Esc): plums long")
    assert rows[1].endswith("a long question about plums")
    term.send("\r")
    term.expect(r"resumed [0-9a-f-]+: 3 messages")


def test_ctrl_o_at_a_question_shows_the_last_result_whole_then_asks_again(serve, terminal, workspace):
    (workspace / "notes.txt").write_text("".join(f"note {i}\n" for i in range(20)))

    def model(body):
        done = sum(m["role"] == "tool" for m in body["messages"])
        if done < 2:
            return reply(tool_calls=[call("Read", {"file_path": "notes.txt"}) if done == 0 else
                                     call("Bash", {"command": "echo ran"})])
        return reply("done: " + last_result(body))

    server = serve(model)
    env = pager_env(server, "sh -c 'cat; sleep 1.2'")
    term = terminal(server, env=env, term="xterm")
    term.send("go\r")
    term.expect(r"Allow Bash\? \[y/n/a/s\] ")
    term.send("\x0f")
    shown = term.expect(r"Allow Bash\? \[y/n/a/s\] ")
    assert "Read(notes.txt)\r\n" in shown and "note 10\r\n" in shown and "Please answer" not in shown
    term.send("y\r")
    shown = term.expect("done: ran")
    assert float(re.search(r"⎿ ran\x1b\[90m \((\d+\.\d) s\)", shown).group(1)) < 1.2  # the pager's time is not the tool's


@pytest.mark.parametrize("ended", [False, True], ids=["the-reply-waiting", "the-last-text-waiting"])
def test_a_terminal_closed_while_the_pager_has_it_ends_the_pager_and_the_session(serve, terminal, tmp_path, ended):
    """SIGHUP (the terminal closed) while Ctrl-O's pager is open ends the pager too, though it ignores its terminal
    (`more` spins on a hung-up one): the session does not wait for it."""
    (tmp_path / "pager").write_text(f"#!/bin/sh\necho $$ > {tmp_path}/pid\ncat\necho paging\nexec sleep 60\n")
    (tmp_path / "pager").chmod(0o755)
    release, sent = threading.Event(), threading.Event()

    def model(body):
        if body["messages"][-1]["role"] == "user":
            return reply(tool_calls=[call("Bash", {"command": "seq 1 30"})])
        return held("while the pager\n", "the end", release, sent.set)

    server = serve(model)
    env = pager_env(server, str(tmp_path / "pager"))
    term = terminal(server, "--yes", term="xterm", env=env)
    term.send("go\r")
    term.expect("while the pager")
    term.send("\x0f")
    term.expect("paging")
    if ended:  # the reply is in: the turn waits to show it
        release.set()
        assert sent.wait(10)
    os.kill(term.proc.pid, signal.SIGHUP)
    assert term.proc.wait(10) == 129
    pid, deadline = (tmp_path / "pid").read_text().strip(), time.monotonic() + 10
    while running(pid):
        assert time.monotonic() < deadline, "the pager outlived the session"
        time.sleep(0.05)


def running(pid: str) -> bool:
    """Whether a process is alive (not gone, not a zombie)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_the_resume_picker_shows_control_characters_of_old_prompts_escaped(serve, terminal, workspace, run):
    server = serve(lambda body: reply("answered"))
    home = {"SOLO_HOME": str(workspace.parent / "solo-home")}
    evil = "evil \x1b[2J\x1b]0;owned\x07 end"
    for prompt in ("first", "second", evil):  # an old prompt with a screen clear and a title in it (a paste, stdin)
        assert run(["-p", prompt], cwd=workspace, base_url=server.url, env=home).code == 0
    term = terminal(server, term="xterm", env={**os.environ, "OPENROUTER_BASE_URL": server.url,
                                               "OPENROUTER_API_KEY": "k", **home})
    term.send("/resume\r")
    rows = picker(term, "Resume which (3/3")
    assert "evil \\x1b[2J\\x1b]0;owned\\x07 end" in rows[1] and "\x1b]0;" not in term.transcript
    term.send("\x1b")
    term.expect("nothing was chosen")


def cooked(term) -> int:
    """What a shell does to the session's terminal at Ctrl-Z and fg: line editing and echo back on, its lines on the
    screen; the terminal's other end, for a look at its modes."""
    import termios
    tty = os.open(f"/proc/{term.proc.pid}/fd/2", os.O_RDWR | os.O_NOCTTY)
    attrs = termios.tcgetattr(tty)
    termios.tcsetattr(tty, termios.TCSANOW, [*attrs[:3], attrs[3] | termios.ICANON | termios.ECHO, *attrs[4:]])
    os.write(tty, b"\r\n[1]+  Stopped   solo\r\n$ fg\r\n")
    return tty


def test_the_picker_and_a_turn_take_the_terminal_back_after_ctrl_z_and_fg(serve, terminal, workspace, run):
    import termios
    release = threading.Event()

    def model(body):
        if user_turns(body)[-1] == "tell me":
            return held("first line\n", "never", release)
        return reply("answered")

    server = serve(model)
    home = {"SOLO_HOME": str(workspace.parent / "solo-home")}
    for fruit in ("apples", "plums"):
        assert run(["-p", f"about {fruit}"], cwd=workspace, base_url=server.url, env=home).code == 0
    term = terminal(server, term="xterm", env={**os.environ, "OPENROUTER_BASE_URL": server.url,
                                               "OPENROUTER_API_KEY": "k", **home})
    term.send("/resume\r")
    head = "Resume which (2/2; type to narrow, ↑↓, Enter, Esc): "
    picker(term, head)
    tty = cooked(term)
    term.expect(r"\$ fg\r+\n")
    assert picker(term, head)[1].endswith("about plums")  # drawn again over the shell's lines, keys one by one
    term.send("app")
    assert picker(term, head.replace("2/2", "1/2") + "app")[1].endswith("about apples")
    term.send("\r")
    term.expect(r"resumed [0-9a-f-]+: 3 messages")
    term.expect(DRAWN_PROMPT)
    term.send("tell me\r")
    term.expect("first line")
    cooked(term)
    deadline = time.monotonic() + 10
    while termios.tcgetattr(tty)[3] & termios.ICANON:  # the turn's key reader puts its modes back
        assert time.monotonic() < deadline, "the turn left the terminal to line editing"
        time.sleep(0.02)
    term.send("\x1b")  # Esc interrupts at once again, no Enter needed
    term.expect("cancelled")
    term.expect(DRAWN_PROMPT)
    release.set()
    os.close(tty)
