"""Prompt caching on the wire: the cache switch, one session id per run, byte-stable prefixes, usage sums."""

from __future__ import annotations

import json

from tests.fake_openrouter import call, reply


def five_tool_turns(body):
    """Five turns of small tool calls, then an answer."""
    turns = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if turns < 5:
        return reply(tool_calls=[call("Bash", {"command": f"echo turn {turns}"}),
                                 call("Read", {"file_path": "missing.txt"})], reasoning="thinking…")
    return reply("done")


def test_anthropic_requests_ask_for_caching_with_one_session_id(serve, run, workspace):
    server = serve(five_tool_turns)
    assert run(["-p", "go"], cwd=workspace, base_url=server.url).code == 0
    assert len(server.bodies) == 6
    assert all(b["cache_control"] == {"type": "ephemeral"} for b in server.bodies)
    session_ids = {h["x-session-id"] for h in server.headers}  # a header: strict servers refuse unknown fields
    assert len(session_ids) == 1 and 0 < len(session_ids.pop()) <= 256


def test_each_run_has_its_own_session_id(serve, run, workspace):
    server = serve(lambda body: reply("ok"))
    run(["-p", "a"], cwd=workspace, base_url=server.url)
    run(["-p", "b"], cwd=workspace, base_url=server.url)
    assert server.headers[0]["x-session-id"] != server.headers[1]["x-session-id"]


def test_other_models_are_left_to_their_provider(serve, run, workspace):
    server = serve(lambda body: reply("ok"), accept="")
    run(["-p", "x", "--model", "openai/gpt-5-mini"], cwd=workspace, base_url=server.url)
    assert "cache_control" not in server.bodies[0] and server.headers[0]["x-session-id"]


def test_the_switch_turns_caching_off(serve, run, workspace):
    server = serve(lambda body: reply("ok"))
    run(["-p", "x", "--no-cache"], cwd=workspace, base_url=server.url)
    run(["-p", "x"], cwd=workspace, base_url=server.url, env={"SOLO_NO_CACHE": "1"})
    assert all("cache_control" not in b for b in server.bodies)


def test_each_request_starts_with_the_previous_one_byte_for_byte(serve, run, workspace):
    server = serve(five_tool_turns)
    run(["-p", "go"], cwd=workspace, base_url=server.url)
    for before, after in zip(server.raw, server.raw[1:]):
        assert before.endswith(b"]}")
        assert after.startswith(before[:-2])  # everything but the closing of `messages` and the body


def test_usage_is_summed_across_turns(serve, run, workspace):
    server = serve(five_tool_turns)
    result = run(["-p", "go", "--output-format", "json", "-v"], cwd=workspace, base_url=server.url)
    obj = json.loads(result.stdout)[-1]  # with --verbose: Claude Code's array of every event, the result last
    assert obj["usage"] == {"requests": 6, "input_tokens": 180, "output_tokens": 60,  # 600 less cache reads and writes
                            "cache_read_input_tokens": 300, "cache_creation_input_tokens": 120}
    assert abs(obj["total_cost_usd"] - 0.006) < 1e-9
    assert "6 requests, 600 prompt tokens (300 cached, 120 cache writes), 60 completion tokens, $0.0060" in result.stderr
