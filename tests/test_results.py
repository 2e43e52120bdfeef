"""What a session shows of tool results (issue 33, faults 7 and 12): previews that say how many lines they hide, Ctrl-O's
list of this turn's results and running commands, and a sub-agent's calls under its Agent call's line."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from app import main as agent
from tests.conftest import screen_of
from tests.fake_openrouter import call, last_result, reply
from tests.test_session import DRAWN_PROMPT, pager_env, picker

MORE = "… +{} lines (ctrl-o to expand)"


# --- Previews count every line they hide -----------------------------------------------------------


def rows_output(count: int) -> str:
    return "".join(f"row number {i}\n" for i in range(1, count + 1))


def test_a_command_cut_by_its_output_buffer_counts_all_its_lines(tmp_path):
    """5,000 rows, of which the head-and-tail buffer kept about 1,900: the preview hides 4,992 of them, not 1,900."""
    content = agent.tool_bash(agent.ToolContext(tmp_path, {"PATH": "/usr/bin:/bin"}),
                              "for i in $(seq 1 5000); do echo row number $i; done")
    assert re.search(r"\[\.\.\. \d+ lines, \d+ bytes omitted \.\.\.\]", content)
    assert agent.result_summary("Bash", {}, content) == [f"row number {i}" for i in range(1, 9)] + [MORE.format(4992)]


def test_the_tools_own_cap_is_counted_too():
    clipped = agent.clip(rows_output(5000), 1000)
    assert agent.result_summary("mcp__s__dump", {}, clipped) == ["row number 1", MORE.format(4999)]
    assert agent.result_summary("Bash", {}, clipped)[-1] == MORE.format(4992)


@pytest.mark.parametrize("content, rows", [
    ("found it\nsecond\nthird", ["found it", MORE.format(2)]),  # a sub-agent's answer
    ("one line", ["one line"]),
    ("x" * 50_000, ["x" * 197 + "..."]),  # one line, cut across: nothing hidden
])
def test_a_one_line_preview_says_how_many_lines_it_hides(content, rows):
    assert agent.result_summary("Agent", {}, content) == rows


def test_a_background_shells_output_shows_its_first_lines_and_its_state_first():
    content = "".join(f"{i}\n" for i in range(1, 21)) + "[running]"
    assert agent.result_summary("BashOutput", {}, content) == ["[running]", *map(str, range(1, 8)), MORE.format(13)]
    assert agent.result_summary("BashOutput", {}, "1\n2\n[exit code 0]") == ["1", "2"]


def test_a_failed_command_says_so_first_when_its_end_is_cut():
    content = "".join(f"{i}\n" for i in range(1, 21)) + "[exit code 2]"
    assert agent.result_summary("Bash", {}, content) == ["[exit code 2]", *map(str, range(1, 8)), MORE.format(13)]
    assert agent.result_summary("Bash", {}, "a\nb\n[exit code 2]") == ["a", "b", "[exit code 2]"]  # not cut: in place


def test_the_cut_markers_count_the_line_breaks_they_take():
    sink = agent.HeadTail(4)
    sink.feed(b"ab\ncd\nef\ngh\nij")
    assert sink.text() == "ab\nc\n[... 2 lines, 6 bytes omitted ...]\nh\nij"
    assert agent.result_lines(sink.text()) == (["ab", "c", "h", "ij"], 1)  # ab cd ef gh ij: 5 lines
    assert agent.clip("abcdefghij" * 3, 10) == "abcde\n[... 20 characters omitted ...]\nfghij"  # no break: as it was


def test_a_glob_that_stopped_counts_every_file_it_found():
    content = "\n".join(f"f{i}" for i in range(100)) + "\n[150 more files not shown (250 in all); narrow the search]"
    assert agent.result_summary("Glob", {}, content) == ["250 files"]


def test_a_tool_line_shows_its_main_argument_not_json():
    assert agent.call_label("Agent", {"description": "look around", "prompt": "p"}) == "Agent(look around)"
    assert agent.call_label("BashOutput", {"bash_id": "bash_1"}) == "BashOutput(bash_1)"


# --- Ctrl-O: this turn's results, and running commands' output so far --------------------------------


def tools_done(body: dict) -> int:
    return sum(m["role"] == "tool" for m in body["messages"])


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 15
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never showed"
        time.sleep(0.05)


def test_a_cut_preview_counts_the_rows_and_ctrl_o_shows_a_single_result_at_once(serve, terminal):
    command = "for i in $(seq 1 5000); do echo row number $i; done"
    server = serve(lambda body: reply(tool_calls=[call("Bash", {"command": command})]) if tools_done(body) == 0
                   else reply("listed"))
    term = terminal(server, "--yes", env=pager_env(server, "cat"))
    term.send("list\r")
    shown = term.expect("listed")
    assert "    row number 8\r\n    … +4992 lines (ctrl-o to expand)\r\n" in shown and "row number 9\r" not in shown
    term.expect(DRAWN_PROMPT)
    term.send("\x0f")
    term.expect(r"row number 4999\r\nrow number 5000")
    assert "Show which result" not in term.transcript


SLOW = "for i in $(seq 1 30); do echo fg $i; done; touch written; until [ -f go ]; do sleep 0.05; done\n"


def test_ctrl_o_in_a_turn_lists_a_running_commands_output_first_then_the_turns_results(serve, terminal, workspace):
    (workspace / "slow.sh").write_text(SLOW)

    def model(body):
        done = tools_done(body)
        if done < 2:
            return reply(tool_calls=[call("Bash", {"command": "echo first" if done == 0 else "sh slow.sh"})])
        return reply("finished")

    server = serve(model)
    term = terminal(server, "--yes", term="xterm", env=pager_env(server, "cat"))
    term.send("go\r")
    wait_for(workspace / "written")
    term.send("\x0f")
    rows = picker(term, "Show which result (2/2; type to narrow, ↑↓, Enter, Esc): ")
    assert rows[1:3] == ["❯ ● Bash(sh slow.sh) (running) — fg 1", "  ● Bash(echo first) — first"]
    term.send("\r")
    term.expect(r"fg 29\r\nfg 30\r\n")  # its output so far, through the pager
    (workspace / "go").touch()
    term.expect("finished")
    term.expect(DRAWN_PROMPT)
    term.send("\x0f")  # at the prompt: the last turn's results, the last one first
    rows = picker(term, "Show which result (2/2; type to narrow, ↑↓, Enter, Esc): ")
    assert rows[1:3] == ["❯ ● Bash(sh slow.sh) — fg 1", "  ● Bash(echo first) — first"]
    term.send("\x1b[B\r")
    term.expect(r"Bash\(echo first\)\r\nfirst")
    term.expect(DRAWN_PROMPT)


def test_ctrl_o_lists_a_background_shells_output_so_far(serve, terminal, workspace):
    (workspace / "bg.sh").write_text("for i in $(seq 1 30); do echo bg $i; done; touch written; exec sleep 60\n")
    server = serve(lambda body: reply(tool_calls=[call("Bash", {"command": "sh bg.sh", "run_in_background": True})])
                   if tools_done(body) == 0 else reply("started it"))
    term = terminal(server, "--yes", term="xterm", env=pager_env(server, "cat"))
    term.send("go\r")
    term.expect("started it")
    term.expect(DRAWN_PROMPT)
    wait_for(workspace / "written")
    term.send("\x0f")
    rows = picker(term, "Show which result (2/2; type to narrow, ↑↓, Enter, Esc): ")
    assert rows[1] == "❯ ● bash_1: sh bg.sh (running in the background) — bg 1"
    assert rows[2].startswith("  ● Bash(sh bg.sh) — Started in the background as bash_1")
    term.send("\r")
    term.expect(r"bg 29\r\nbg 30")
    term.expect(DRAWN_PROMPT)
    term.send("/exit\r")
    assert term.wait() == 0


def test_ctrl_o_at_the_prompt_of_a_dumb_terminal_asks_by_number(serve, terminal):
    def model(body):
        done = tools_done(body)
        return reply(tool_calls=[call("Bash", {"command": f"echo result-{done + 1}"})]) if done < 2 else reply("ok")

    server = serve(model)
    term = terminal(server, "--yes", env=pager_env(server, "cat"))
    term.ask("go", "ok")
    term.send("\x0f")
    shown = term.expect(r"Show which result \(1-2\)\? ")
    assert re.search(r" 1\. ● Bash\(echo result-2\) — result-2\r\n.* 2\. ● Bash\(echo result-1\) — result-1", shown)
    term.send("2\r")
    term.expect(r"Bash\(echo result-1\)\r\nresult-1")
    term.expect(DRAWN_PROMPT)


# --- A sub-agent's calls under its Agent call's line ----------------------------------------------------


def sub_agents(release: threading.Event | None = None, calls: int = 2):
    """A model whose prompt starts one sub-agent per word of the prompt; each runs `calls` commands, one at a time (the
    second once `release` is set), then answers in three lines."""
    def model(body):
        task, done = body["messages"][1]["content"], tools_done(body)
        if task.startswith("sub "):
            if done < calls:
                if done == 1 and release:
                    assert release.wait(20)
                return reply(tool_calls=[call("Bash", {"command": f"echo {task[4:]}-{done + 1}"})])
            return reply(f"{task[4:]} found it\nsecond line\nthird line")
        if done == 0:
            return reply(tool_calls=[call("Agent", {"description": word, "prompt": f"sub {word}"})
                                     for word in body["messages"][-1]["content"].split()])
        return reply("all done")
    return model


def test_a_sub_agents_calls_show_under_its_line_then_collapse_to_a_count(serve, terminal):
    release = threading.Event()
    server = serve(sub_agents(release))
    term = terminal(server, "--yes", term="xterm", env=pager_env(server, "cat"))
    term.send("look\r")
    term.expect(r"\x1b\[1mAgent\(look\)\x1b\[0m\r\n")
    term.expect(r"\x1b\[90m  ⎿ Bash\(echo look-1\)\x1b\[0m\r\n")  # as it happens: the sub-agent is still at work
    release.set()
    shown = term.expect("all done")
    assert "Agent({" not in term.transcript
    drawn = re.search(r"  ⎿ Bash\(echo look-2\)\x1b\[0m\r\n(.*?)  ⎿ Done", shown, re.DOTALL)
    assert drawn and drawn.group(1).endswith("\x1b[2A\r\x1b[J")  # over its two lines: nothing was drawn below
    assert re.search(r"  ⎿ Done\x1b\[90m \(2 tool uses · \d+\.\d s\)\x1b\[0m\r\n    look found it\r\n"
                     r"    … \+2 lines \(ctrl-o to expand\)\r\n", shown)
    term.expect(DRAWN_PROMPT)
    term.send("\x0f")  # the sub-agent's own results are this turn's too
    rows = picker(term, "Show which result (3/3; type to narrow, ↑↓, Enter, Esc): ")
    assert rows[1:4] == ["❯ ● Agent(look) — look found it", "  ● look › Bash(echo look-2) — look-2",
                         "  ● look › Bash(echo look-1) — look-1"]
    term.send("\r")
    term.expect(r"Agent\(look\)\r\nlook found it\r\nsecond line\r\nthird line")
    term.expect(DRAWN_PROMPT)


def test_sub_agents_side_by_side_name_their_calls_when_they_interleave(serve, terminal):
    beta_done = threading.Event()
    plain = sub_agents(calls=1)

    def model(body):
        task = body["messages"][1]["content"]
        if task == "sub alpha" and tools_done(body) == 0:
            assert beta_done.wait(20)  # alpha's call comes after beta's: under beta's line, so it names alpha
        if task == "sub beta" and tools_done(body) == 1:
            beta_done.set()
        return plain(body)

    server = serve(model)
    term = terminal(server, "--yes", term="xterm")
    term.send("alpha beta\r")
    shown = term.expect("all done")
    plain_text = screen_of(shown)  # the screen as drawn: the status line and the input line under it drawn over
    assert plain_text.index("● Agent(alpha)") < plain_text.index("● Agent(beta)\n  ⎿ Bash(echo beta-1)\n")
    assert "  ⎿ alpha › Bash(echo alpha-1)\n" in plain_text
    for word in ("alpha", "beta"):  # each ends as a line of its own, under its Agent line again
        assert re.search(rf"● Agent\({word}\)\n  ⎿ Done \(1 tool use · \d+\.\d s\)\n    {word} found it\n",
                         plain_text)
    assert "A\r\x1b[J" not in shown[:shown.rindex("found it")]  # nothing was drawn over (the answer's streamed
    # line is, once complete)


def test_a_sub_agents_calls_on_a_dumb_terminal_are_plain_lines(serve, terminal):
    server = serve(sub_agents(calls=1))
    term = terminal(server, "--yes")
    term.send("look\r")
    shown = term.expect("all done")
    assert re.search(r"● Agent\(look\)\r\n  ⎿ Bash\(echo look-1\)\r\n  ⎿ Done \(1 tool use · \d+\.\d s\)\r\n"
                     r"    look found it\r\n    … \+2 lines \(ctrl-o to expand\)\r\n", shown)
    assert "\x1b" not in shown
