"""The command line: output formats, verbose trace, prompt sources, tool choice, trace file, usage errors."""

from __future__ import annotations

import io
import json
import os
import re
import select
import subprocess
import time
from pathlib import Path

import pytest

from app import main as agent
from tests.conftest import PROGRAM, ROOT
from tests.fake_openrouter import call, last_result, reply, streamed, tool_then


def tool_then_answer(body):
    """Run `echo hi` once, then answer with the user's message."""
    if body["messages"][-1]["role"] == "user":
        return reply(tool_calls=[call("Bash", {"command": "echo hi"}, id="c1")])
    return reply("answer: " + body["messages"][1]["content"])


def test_json_output_is_one_result_object(serve, run, workspace):
    server = serve(tool_then_answer)
    result = run(["-p", "q", "--output-format", "json"], cwd=workspace, base_url=server.url)
    assert result.code == 0
    obj = json.loads(result.stdout)
    assert obj["type"] == "result" and obj["subtype"] == "success" and obj["is_error"] is False
    assert obj["result"] == "answer: q" and obj["num_turns"] == 2 and obj["total_cost_usd"] == pytest.approx(0.002)
    assert obj["duration_ms"] >= 0 and obj["usage"]["input_tokens"] == 60  # Anthropic's: 200 less 100 read, 40 written
    assert obj["usage"]["cache_read_input_tokens"] == 100 and obj["usage"]["cache_creation_input_tokens"] == 40


def test_json_output_for_a_failure_is_a_result_object_too(serve, run, workspace):
    server = serve(lambda body: reply(tool_calls=[call("Bash", {"command": "true"})]))
    result = run(["-p", "q", "--output-format", "json", "--max-turns", "2"], cwd=workspace, base_url=server.url)
    obj = json.loads(result.stdout)
    assert result.code == 3 and obj["subtype"] == "error_max_turns" and obj["is_error"] is True
    assert "--max-turns" in obj["result"]


@pytest.mark.parametrize("output_format", ["json", "stream-json"])
@pytest.mark.parametrize("flags, env, message", [
    (["-p", "q"], {"OPENROUTER_API_KEY": ""}, "OPENROUTER_API_KEY is not set"),
    (["-p", ""], {}, "the prompt is empty"),
    (["-p", "q", "--trace", "no/such/folder/trace.jsonl"], {}, "cannot open the trace file"),
])
def test_json_output_has_a_result_object_for_failures_before_the_run(serve, run, workspace, output_format,
                                                                      flags, env, message):
    server = serve(lambda body: reply("never"))
    result = run([*flags, "--output-format", output_format], cwd=workspace, base_url=server.url, env=env)
    assert result.code == 2 and len(result.stdout.splitlines()) == 1 and server.bodies == []
    obj = json.loads(result.stdout)
    assert (obj["type"], obj["subtype"], obj["is_error"]) == ("result", "error_during_execution", True)
    assert obj["result"].startswith(message) and f"solo: {obj['result']}" in result.stderr


def test_stream_json_emits_events_then_the_result(serve, run, workspace):
    server = serve(tool_then_answer)
    result = run(["-p", "q", "--output-format", "stream-json"], cwd=workspace, base_url=server.url)
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert [e["type"] for e in events] == ["system", "system", "assistant", "user", "system", "assistant",
                                           "result"]  # Claude Code's: a system/status before each request
    init, status, call_event, result_event, _, answer, last = events
    assert (status["subtype"], status["status"], status["session_id"]) == ("status", "requesting", last["session_id"])
    assert init["subtype"] == "init" and init["cwd"] == str(workspace) and init["model"] == "anthropic/claude-haiku-4.5"
    assert "Bash" in init["tools"] and init["session_id"] == last["session_id"]
    assert call_event["message"]["content"] == [{"type": "tool_use", "id": "c1", "name": "Bash",
                                                 "input": {"command": "echo hi"}}]
    assert result_event["message"] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "c1", "content": "hi\n[exit code 0]", "is_error": False}]}
    assert answer["message"]["content"] == [{"type": "text", "text": "answer: q"}]
    assert last["result"] == "answer: q" and last["stop_reason"] == "end_turn" and last["permission_denials"] == []
    assert last["duration_api_ms"] >= 0 and last["modelUsage"]["anthropic/claude-haiku-4.5"]["inputTokens"] == 60


def test_verbose_traces_on_stderr_and_keeps_stdout_clean(serve, run, workspace):
    server = serve(tool_then_answer)
    result = run(["-p", "q", "-v"], cwd=workspace, base_url=server.url)
    assert result.stdout == "answer: q\n"
    lines = result.stderr.splitlines()
    assert lines[0].startswith('solo: Bash({"command": "echo hi"}) -> ok, 16 chars, ')
    assert lines[-1].startswith("solo: done: 2 turns, 2 requests, 200 prompt tokens (100 cached")


def program_env(server) -> dict:
    """The environment for running the program against this server."""
    return {**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "k"}


def piped(server, workspace, args, text):
    """Run the program with `text` piped to its stdin."""
    return subprocess.run([str(PROGRAM), *args], input=text, capture_output=True, text=True, cwd=workspace,
                          env=program_env(server))


def test_prompt_from_piped_stdin(serve, workspace):
    server = serve(lambda body: reply("got it"))
    proc = piped(server, workspace, [], "explain this\n")
    assert proc.returncode == 0 and proc.stdout == "got it\n"
    assert server.bodies[-1]["messages"][1]["content"] == "explain this"


def test_piped_stdin_is_added_to_a_p_prompt(serve, workspace):
    server = serve(lambda body: reply("ok"))
    assert piped(server, workspace, ["-p", "why?"], "ERROR: disk full\n").returncode == 0
    assert server.bodies[0]["messages"][1]["content"] == "why?\n\n<stdin>\nERROR: disk full\n</stdin>"


def test_p_reads_piped_context_to_its_end_and_says_it_waits(serve, workspace):
    server = serve(lambda body: reply("ok"))
    proc = subprocess.Popen([str(PROGRAM), "-p", "why"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=workspace, env=program_env(server))
    if not select.select([proc.stderr], [], [], 30)[0]:  # a program that neither says it waits nor stops
        proc.kill()
    assert proc.stderr.readline() == "solo: waiting for stdin to end (it is a pipe that is still open)\n"
    proc.stdin.write("first\n")
    proc.stdin.flush()
    time.sleep(1.5)  # a writer that pauses before its last line; not a race: stdin is read to its end regardless
    stdout, _ = proc.communicate("late\n", timeout=30)
    assert (proc.returncode, stdout) == (0, "ok\n")
    assert server.bodies[0]["messages"][1]["content"] == "why\n\n<stdin>\nfirst\nlate\n</stdin>"


@pytest.mark.parametrize("args", [["-p", "why"], []])
def test_piped_stdin_beyond_the_limit_keeps_head_and_tail_and_says_so(serve, workspace, args):
    limit = agent.READ_LIMIT
    server = serve(lambda body: reply("ok"))
    proc = piped(server, workspace, args, "h" * limit + "m" * 100 + "t" * limit)
    assert proc.returncode == 0
    assert "h" * limit + "\n[... 100 bytes omitted ...]\n" + "t" * limit in server.bodies[0]["messages"][1]["content"]
    assert f"solo: stdin was {2 * limit + 100} bytes; only its first and last {limit} bytes were kept\n" in proc.stderr


def test_closed_stdin_adds_nothing(serve, run, workspace):
    server = serve(lambda body: reply("ok"))
    run(["-p", "plain"], cwd=workspace, base_url=server.url)
    assert server.bodies[0]["messages"][1]["content"] == "plain"


ALL_TOOLS = ["Read", "Write", "Edit", "Bash", "Glob", "Grep", "BashOutput", "KillShell", "NotebookEdit", "WebFetch",
             "WebSearch", "TodoWrite", "Agent"]


@pytest.mark.parametrize("flags, advertised", [  # --tools chooses what is offered; --allowed-tools and
    (["--tools", "Read,Grep"], ["Read", "Grep"]),  # --disallowed-tools are Claude Code's rules: only a deny of a
    (["--tools", "Read Bash WebSearch"], ["Read", "Bash", "WebSearch"]),  # whole tool takes it off, as Claude Code
    (["--tools", "Task,WebFetch"], ["WebFetch", "Agent"]),  # Task: Agent's former name
    (["--tools", ""], []),
    (["--disallowed-tools", "Bash, Write"], [t for t in ALL_TOOLS if t not in ("Bash", "Write")]),
    (["--disallowed-tools", "Bash(rm:*) Write(/x)"], ALL_TOOLS),
    (["--allowedTools", "Read Bash(git status:*)"], ALL_TOOLS),
])
def test_tool_choice(serve, run, workspace, flags, advertised):
    server = serve(lambda body: reply("ok"))
    assert run(["-p", "x", *flags], cwd=workspace, base_url=server.url).code == 0
    assert [t["function"]["name"] for t in server.bodies[0].get("tools", [])] == advertised


@pytest.mark.parametrize("rule, said", [("Bash", "Error: no tool called Bash"),  # not offered, called anyway
                                         ("Bash(touch:*)", "Error: permission denied by Bash(touch:*)")])
def test_a_disallowed_tool_cannot_be_called(serve, run, workspace, rule, said):
    server = serve(tool_then([call("Bash", {"command": "touch hacked"})], last_result))
    result = run(["-p", "x", "--disallowed-tools", rule], cwd=workspace, base_url=server.url)
    assert result.stdout.startswith(said) and not (workspace / "hacked").exists()


def test_append_system_prompt_and_trace(serve, run, workspace, tmp_path):
    server = serve(tool_then_answer)
    trace = tmp_path / "trace.jsonl"
    result = run(["-p", "x", "--append-system-prompt", "Answer in French.", "--trace", str(trace)],
                 cwd=workspace, base_url=server.url)
    assert result.code == 0
    assert server.bodies[0]["messages"][0]["content"].endswith("Answer in French.")
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [e["type"] for e in events] == ["request", "reply", "assistant", "tool_call", "tool_result",
                                           "request", "reply", "assistant"]
    assert events[0]["body"] == server.bodies[0] and all("time" in e for e in events)
    assert events[4]["seconds"] >= 0 and events[2]["usage"]["prompt_tokens"] == 100
    reply_event = events[1]  # the time to the first byte and in all, then the message rebuilt from the stream
    assert reply_event["status"] == 200 and 0 <= reply_event["first_byte_seconds"] <= reply_event["seconds"]
    assert events[2]["message"] == server.bodies[1]["messages"][2]
    assert "sk-test-secret-123" not in trace.read_text()


def test_a_new_trace_file_is_private_and_an_existing_one_keeps_its_mode(serve, run, workspace, tmp_path):
    """The trace holds the whole conversation: created 0600 (whatever the umask); a file the user made is theirs."""
    server = serve(lambda body: reply("ok"))
    new, kept = tmp_path / "new.jsonl", tmp_path / "kept.jsonl"
    kept.write_text("")
    kept.chmod(0o644)
    for trace in (new, kept):
        assert run(["-p", "x", "--trace", str(trace)], cwd=workspace, base_url=server.url).code == 0
    assert (new.stat().st_mode & 0o777, kept.stat().st_mode & 0o777) == (0o600, 0o644)
    assert new.read_text() and kept.read_text()


@pytest.mark.parametrize("flags, message", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["-p", "x", "--max-turns", "0"], "argument --max-turns: must be above zero"),
    (["-p", "x", "--max-turns", "lots"], "argument --max-turns: not a number"),
    (["-p", "x", "--output-format", "xml"], "argument --output-format: invalid choice"),
    (["-p", "x", "--allowed-tools", "Teleport"], "no tool called Teleport"),
    (["-p", ""], "the prompt is empty"),
    ([], "the prompt is empty"),
])
def test_usage_errors_exit_2_and_send_nothing(serve, run, workspace, flags, message):
    server = serve(lambda body: reply("never"))
    result = run(flags, cwd=workspace, base_url=server.url)
    assert result.code == 2 and result.stdout == "" and server.bodies == []
    assert result.stderr.startswith("solo: ") and message in result.stderr and len(result.stderr.splitlines()) == 1


def test_version_and_help(run, workspace):
    result = run(["--version"], cwd=workspace, base_url="http://127.0.0.1:9")
    assert (result.code, result.stdout) == (0, f"solo {agent.VERSION}\n")
    result = run(["--help"], cwd=workspace, base_url="http://127.0.0.1:9")
    assert result.code == 0
    for option in ("--output-format", "--verbose", "--model", "--allowed-tools", "--disallowed-tools",
                   "--append-system-prompt", "--trace", "--max-turns", "--max-cost", "--yes", "Exit codes"):
        assert option in result.stdout


SESSION_COMMANDS = ("/help", "/clear", "/model", "/cost", "/compact", "/sessions", "/resume", "/mcp", "/mode", "/exit")


def test_help_names_solo_every_documented_variable_the_session_commands_and_examples(run, workspace):
    result = run(["--help"], cwd=workspace, base_url="http://127.0.0.1:9")
    assert result.code == 0 and result.stdout.startswith("usage: solo [")
    readme = (ROOT / "README.md").read_text().partition("### Environment\n")[2].partition("\n#")[0]
    first_cells = [line.split("|")[1] for line in readme.splitlines() if line.startswith("| `")]
    variables = {name for cell in first_cells for name in re.findall(r"`([A-Z][A-Z0-9_]+)", cell)}
    assert {"OPENROUTER_API_KEY", "SOLO_READ_TIMEOUT", "SOLO_NO_CACHE", "MCP_TOOL_TIMEOUT"} <= variables  # all forms
    assert [name for name in sorted(variables) if name not in result.stdout] == []
    assert [command for command in SESSION_COMMANDS if command not in result.stdout] == []
    examples = result.stdout.partition("Examples:\n")[2].partition("\n\n")[0].splitlines()
    assert len([line for line in examples if line.strip().startswith(("solo ", "git diff | solo "))]) >= 3


def test_main_in_process_with_injected_streams(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    code = agent.main(["-p", "x"], env={"OPENROUTER_API_KEY": "", "HOME": str(tmp_path)},
                      streams=agent.Streams(None, out, err))
    assert code == 2 and out.getvalue() == "" and "OPENROUTER_API_KEY is not set" in err.getvalue()


def test_api_key_is_redacted_from_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    key = "sk-or-v1-abcdef123456"
    code = agent.main(["-p", "x"], env={"OPENROUTER_API_KEY": key, "OPENROUTER_BASE_URL": f"http://127.0.0.1:9/{key}",
                                        "SOLO_MAX_ATTEMPTS": "1"}, streams=agent.Streams(None, out, err))
    assert code == 1 and key not in err.getvalue() and "***" in err.getvalue()


def test_a_reader_that_leaves_early_gets_no_noise(serve, workspace):
    server = serve(lambda body: streamed(reply("y" * 2_000_000), size=10_000))  # 7-character pieces take long
    proc = subprocess.run(f"'{PROGRAM}' -p hi | head -c 5", shell=True, cwd=workspace, env=program_env(server),
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert proc.stdout == "yyyyy" and proc.stderr == ""


@pytest.mark.parametrize("closed, stdout", [("2>&-", "answer: q\n"), (">&-", "")], ids=["stderr", "stdout"])
def test_a_closed_stdout_or_stderr_does_not_crash_the_run(serve, workspace, closed, stdout):
    server = serve(tool_then_answer)
    proc = subprocess.run(["sh", "-c", f'"$0" -p q -v {closed}', str(PROGRAM)], cwd=workspace,
                          env=program_env(server), stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert (proc.returncode, proc.stdout) == (0, stdout) and len(server.bodies) == 2
    assert all(line.startswith("solo: ") for line in proc.stderr.splitlines())  # no traceback


class Terminal(io.StringIO):
    """An output stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("text, on_a_terminal", [
    ("\x1b[31mred\x1b[0m", "red"),  # colour
    ("\x1b]0;new title\x07shell", "shell"),  # window title
    ("\x1b[2J\x1b[Hcleared", "cleared"),  # clear the screen, move the cursor
    ("one-byte\x9b csi", "one-byte csi"),  # C1 control
    ("bell\x07 back\bspace\r", "bell backspace"),
    ("tab\tand\nnew line, ünïcode ✓", "tab\tand\nnew line, ünïcode ✓"),  # kept
], ids=["colour", "title", "screen", "c1", "controls", "kept"])
def test_escape_sequences_in_the_answer_are_stripped_only_on_a_terminal(text, on_a_terminal):
    cfg = agent.Config(api_key="k", cwd=Path("."))
    for stream, shown in ((Terminal(), on_a_terminal), (io.StringIO(), text)):
        agent.Reporter(cfg, agent.Streams(None, stream, io.StringIO())).answer(text)
        assert stream.getvalue() == shown + "\n"
        assert agent.for_terminal(text, stream) == shown


def test_a_piped_answer_keeps_escape_sequences_exactly(serve, run, workspace):
    answer = "\x1b[1;31mbold red\x1b[0m \x1b]0;title\x07 \x9b bell\x07"
    server = serve(lambda body: reply(answer))
    result = run(["-p", "q"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, answer + "\n")
