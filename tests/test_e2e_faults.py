"""End to end against a misbehaving API, limits, and signals: what a fault-injection suite would do."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest

from app import main as agent
from tests.conftest import PROGRAM
from tests.fake_openrouter import DROP, Raw, Stream, call, reply, streamed


def sequence(*answers):
    """A model script that gives these answers in turn, then repeats the last."""
    state = {"n": 0}

    def model(body):
        state["n"] += 1
        return answers[min(state["n"], len(answers)) - 1]

    return model


def test_429_with_retry_after_then_success(serve, run, workspace):
    server = serve(sequence(Raw(429, {"error": {"code": 429, "message": "Rate limited"}}, {"Retry-After": "1"}),
                            reply("after the wait")))
    result = run(["-p", "x"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "after the wait\n")
    assert server.times[1] - server.times[0] >= 0.9
    assert "retrying in 1.0 s (attempt 2/6): HTTP 429: Rate limited" in result.stderr


def test_dropped_connection_then_success(serve, run, workspace):
    server = serve(sequence(DROP, reply("back again")))
    result = run(["-p", "x"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "back again\n") and len(server.bodies) == 2
    assert "retrying in" in result.stderr


def test_401_fails_at_once_with_a_hint(serve, run, workspace):
    server = serve(sequence(Raw(401, {"error": {"code": 401, "message": "User not found."}})))
    result = run(["-p", "x"], cwd=workspace, base_url=server.url)
    assert result.code == 1 and result.stdout == "" and len(server.bodies) == 1
    assert result.stderr.strip() == "solo: HTTP 401: User not found. (check OPENROUTER_API_KEY)"


def test_200_with_an_error_body_is_retried(serve, run, workspace):
    server = serve(sequence({"error": {"code": 502, "message": "Provider returned error"}}, reply("ok")))
    result = run(["-p", "x"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "ok\n") and len(server.bodies) == 2


def test_unreachable_api_gives_up_with_one_line(run, workspace):
    result = run(["-p", "x"], cwd=workspace, base_url="http://127.0.0.1:9/api/v1",
                 env={"SOLO_MAX_ATTEMPTS": "1"})
    assert result.code == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("solo: could not reach http://127.0.0.1:9/api/v1/chat/completions")


def test_a_refused_connection_on_this_machine_fails_at_once(run, workspace):
    started = time.monotonic()
    result = run(["-p", "x"], cwd=workspace, base_url="http://127.0.0.1:9/api/v1")
    assert time.monotonic() - started < 6  # retrying with backoff would take 15 s or more
    lines = result.stderr.splitlines()
    assert result.code == 1 and len(lines) == 1 and "connection refused" in lines[0]


@pytest.mark.parametrize("content, reasoning, notice", [
    (None, "I thought it over", "the model's answer was empty (it only reasoned)"),
    ("", None, "the model's answer was empty"),
])
def test_an_empty_answer_is_said_on_stderr(serve, run, workspace, content, reasoning, notice):
    server = serve(lambda body: reply(content, reasoning=reasoning))
    result = run(["-p", "x"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout.strip(), result.stderr) == (0, "", f"solo: {notice}\n")


def test_max_turns_stops_with_exit_3(serve, run, workspace):
    server = serve(lambda body: reply(tool_calls=[call("Bash", {"command": "echo again"})]))
    result = run(["-p", "loop forever", "--max-turns", "3"], cwd=workspace, base_url=server.url)
    assert result.code == 3 and result.stdout == "" and len(server.bodies) == 3
    assert "--max-turns limit was reached after 3 turns" in result.stderr


def test_max_cost_stops_with_exit_3(serve, run, workspace):
    server = serve(lambda body: reply(tool_calls=[call("Bash", {"command": "true"})],
                                      usage={"prompt_tokens": 5, "completion_tokens": 5, "cost": 0.02}))
    result = run(["-p", "spend", "--max-cost", "0.05"], cwd=workspace, base_url=server.url)
    assert result.code == 3 and len(server.bodies) == 3 and "--max-cost" in result.stderr


PRICED = [{"id": "anthropic/claude-haiku-4.5", "pricing": {"prompt": "0.001", "completion": "0.002"}}]
NO_COST = {"prompt_tokens": 10, "completion_tokens": 5}  # $0.02 a turn at PRICED, but no `cost` reported


def test_max_cost_estimates_at_the_list_price_when_the_server_reports_no_cost(serve, run, workspace):
    server = serve(lambda body: reply(tool_calls=[call("Bash", {"command": "true"})], usage=NO_COST), models=PRICED)
    result = run(["-p", "spend", "--max-cost", "0.05"], cwd=workspace, base_url=server.url)
    assert result.code == 3 and len(server.bodies) == 3 and server.gets == ["/api/v1/models"]
    assert result.stderr.count("--max-cost counts tokens at anthropic/claude-haiku-4.5's list price") == 1
    assert "--max-cost limit was reached after 3 turns" in result.stderr


def test_max_cost_without_a_known_price_stops_with_one_clear_line(serve, run, workspace):
    server = serve(lambda body: reply(tool_calls=[call("Bash", {"command": "true"})], usage=NO_COST))
    result = run(["-p", "spend", "--max-cost", "0.05"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (2, "") and len(server.bodies) == 1
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("solo: --max-cost cannot be enforced")


def start_long_command(serve, workspace, *flags, **popen):
    """The program running a 60 s command; returns (process, the command's pid)."""
    pid_file = workspace / "pid"
    server = serve(sequence(reply(tool_calls=[call("Bash", {"command": f"echo $$ > {pid_file}; sleep 60"})]),
                            reply("never")))
    env = {**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "k"}
    proc = subprocess.Popen([str(PROGRAM), "-p", "run it", *flags], cwd=workspace, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, int(pid_file.read_text())


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] == "Z"


def test_sigint_during_a_long_command_kills_it_and_exits_130(serve, workspace):
    proc, command_pid = start_long_command(serve, workspace)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 130 and stdout == ""
    assert stderr.strip().endswith("solo: interrupted") and "Traceback" not in stderr
    time.sleep(0.2)
    assert process_gone(command_pid)


def test_sigterm_exits_143(serve, workspace):
    proc, command_pid = start_long_command(serve, workspace)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 143 and "Traceback" not in stderr
    time.sleep(0.2)
    assert process_gone(command_pid)


def stop(proc: subprocess.Popen, sig: int) -> tuple[str, str]:
    """Send a stop signal and wait for the program to end (killing it, and failing, if it does not)."""
    proc.send_signal(sig)
    try:
        return proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the program was still running 10 s after signal {sig}") from None


def test_sighup_during_a_long_command_kills_it_and_exits_129(serve, workspace):
    proc, command_pid = start_long_command(serve, workspace)
    stdout, stderr = stop(proc, signal.SIGHUP)
    assert (proc.returncode, stdout) == (129, "") and stderr.strip().endswith("solo: terminated")
    assert process_gone(command_pid)


def test_sigint_works_even_when_the_program_inherits_it_ignored(serve, workspace):
    # a script's background job (`solo -p ... &`) starts with SIGINT ignored
    proc, command_pid = start_long_command(serve, workspace,
                                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    _, stderr = stop(proc, signal.SIGINT)
    assert proc.returncode == 130 and stderr.strip().endswith("solo: interrupted")
    assert process_gone(command_pid)


@pytest.mark.parametrize("output_format", ["json", "stream-json"])
def test_sigterm_with_json_output_still_prints_a_result_object(serve, workspace, output_format):
    proc, _ = start_long_command(serve, workspace, "--output-format", output_format)
    stdout, _ = stop(proc, signal.SIGTERM)
    result = json.loads(stdout.splitlines()[-1])
    assert proc.returncode == 143
    assert (result["type"], result["subtype"], result["is_error"], result["result"]) == \
        ("result", "error_during_execution", True, "terminated")


def test_a_stop_signal_that_arrives_while_a_command_starts_is_not_lost(monkeypatch, ctx):
    @contextlib.contextmanager
    def delivered_at_the_end():  # what signals_held does with a signal that arrives during Popen
        yield
        raise agent.Terminated(signal.SIGTERM)
    monkeypatch.setattr(agent, "signals_held", delivered_at_the_end)
    with pytest.raises(agent.Terminated):
        agent.tool_bash(ctx, "sleep 30")


# --- Streams that stall, drop, keep alive, or are not streams at all -------------------------------


def text_chunk(text: str, finish=None) -> dict:
    return {"id": "g", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


def test_a_stream_silent_past_the_read_timeout_is_abandoned_and_retried(serve, run, workspace):
    stalled = Stream([text_chunk("partial "), 5.0, text_chunk("never", "stop"), "data: [DONE]\n\n"])
    server = serve(sequence(stalled, reply("second try")))
    started = time.monotonic()
    result = run(["-p", "x", "--read-timeout", "1"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "second try\n") and len(server.bodies) == 2
    assert "no data from the API for 1 s" in result.stderr and time.monotonic() - started < 5


def test_keep_alive_comments_reset_the_read_timeout(serve, run, workspace):
    slow = Stream([": OPENROUTER PROCESSING\n\n", 0.6, ": OPENROUTER PROCESSING\n\n", 0.6,
                   ": OPENROUTER PROCESSING\n\n", 0.6, text_chunk("worth the wait", "stop"), "data: [DONE]\n\n"])
    server = serve(sequence(slow))
    result = run(["-p", "x", "--read-timeout", "1"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "worth the wait\n") and len(server.bodies) == 1


def test_a_dropped_stream_is_retried_and_its_partial_tool_call_never_runs(serve, run, workspace):
    partial = streamed(reply(tool_calls=[call("Bash", {"command": "touch ran-from-a-broken-reply"})]))
    partial.events, partial.drop = partial.events[:-4], True  # cut after the call, before its finish and [DONE]
    server = serve(sequence(partial, reply("clean answer")))
    result = run(["-p", "x"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "clean answer\n") and len(server.bodies) == 2
    assert not (workspace / "ran-from-a-broken-reply").exists() and "retrying in" in result.stderr


def test_a_mid_stream_error_that_is_final_ends_the_run_with_one_line(serve, run, workspace):
    failing = Stream([text_chunk("thinking..."), {"error": {"code": 400, "message": "Token limit reached"},
                                                  "choices": [{"index": 0, "delta": {}, "finish_reason": "error"}]},
                      "data: [DONE]\n\n"])
    server = serve(sequence(failing))
    result = run(["-p", "x"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (1, "") and len(server.bodies) == 1
    assert result.stderr.strip().splitlines() == ["solo: HTTP 400: Token limit reached"]


def test_a_json_answer_to_a_stream_request_and_no_stream_both_work(serve, run, workspace):
    server = serve(lambda body: Raw(200, reply(f"stream={body.get('stream', False)}")))  # a server ignoring `stream`
    assert run(["-p", "x"], cwd=workspace, base_url=server.url).stdout == "stream=True\n"
    assert run(["-p", "x", "--no-stream"], cwd=workspace, base_url=server.url).stdout == "stream=False\n"
    assert run(["-p", "x"], cwd=workspace, base_url=server.url, env={"SOLO_NO_STREAM": "1"}).stdout == "stream=False\n"
    assert "stream_options" not in server.bodies[1] and server.bodies[0]["stream_options"] == {"include_usage": True}
