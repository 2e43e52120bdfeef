"""The agent loop against a scripted model and real tools: limits, cut-off replies, overflow, bad calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app import main as agent
from tests.fake_openrouter import call, reply

TOOLS = {tool.name: tool for tool in agent.TOOLS if tool.name != "Skill"}


def scripted(*answers):
    """A model that gives these answers in turn and records the bodies it was sent."""
    sent = []

    def model(body):
        sent.append(json.loads(agent.encode(body)))
        answer = answers[len(sent) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer(body) if callable(answer) else answer

    model.sent = sent
    return model


def run(model, tmp_path: Path, **overrides):
    cfg = agent.Config(api_key="k", cwd=tmp_path, tools=tuple(TOOLS), **overrides)
    events, usage = [], agent.Usage()
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    outcome = agent.run_agent(cfg, messages, model=model, tools=TOOLS,
                              ctx=agent.ToolContext(cwd=tmp_path, env={}), usage=usage, emit=events.append)
    return outcome, messages, events, usage


def every_call_answered_once(messages) -> bool:
    for i, message in enumerate(messages):
        if message.get("tool_calls"):
            ids = [c["id"] for c in message["tool_calls"]]
            answers = [m["tool_call_id"] for m in messages[i + 1: i + 1 + len(ids)]]
            if answers != ids or len(set(ids)) != len(ids):
                return False
    return True


def test_loops_until_a_reply_without_tool_calls(tmp_path):
    model = scripted(reply(tool_calls=[call("Bash", {"command": "echo hi"})]),
                     reply("the answer", finish_reason="tool_calls"))
    outcome, messages, events, usage = run(model, tmp_path)
    assert outcome == agent.Outcome("the answer", "success", 2)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert model.sent[1]["messages"][3]["content"] == "hi\n[exit code 0]"
    assert usage.requests == 2 and usage.prompt_tokens == 200 and usage.cached_tokens == 100
    assert usage.cache_write_tokens == 40 and usage.cost == pytest.approx(0.002)


def test_a_stop_reason_with_tool_calls_still_runs_them(tmp_path):
    model = scripted(reply(tool_calls=[call("Bash", {"command": "echo x"})], finish_reason="stop"), reply("done"))
    outcome, messages, *_ = run(model, tmp_path)
    assert outcome.answer == "done" and messages[3]["role"] == "tool"


def test_max_turns_stops_a_model_that_never_stops(tmp_path):
    model = scripted(*[reply(tool_calls=[call("Bash", {"command": "true"})])] * 5)
    outcome, messages, *_ = run(model, tmp_path, max_turns=3)
    assert outcome == agent.Outcome("", "error_max_turns", 3) and len(model.sent) == 3
    assert every_call_answered_once(messages)


def test_there_is_no_turn_limit_by_default(tmp_path):
    assert agent.Config(api_key="k", cwd=tmp_path).max_turns is None
    glob = reply(tool_calls=[call("Glob", {"pattern": "*.txt"})])
    model = scripted(*[glob] * 150, reply("done at last"))
    outcome, *_ = run(model, tmp_path)
    assert outcome == agent.Outcome("done at last", "success", 151) and len(model.sent) == 151


def test_max_cost_stops_the_run(tmp_path):
    costly = {"prompt_tokens": 10, "completion_tokens": 1, "cost": 0.3}
    model = scripted(*[reply(tool_calls=[call("Bash", {"command": "true"})], usage=costly)] * 5)
    outcome, *_ , usage = run(model, tmp_path, max_cost=0.5)
    assert outcome.subtype == "error_max_budget_usd" and outcome.turns == 2 and usage.cost == pytest.approx(0.6)


def test_tool_call_cut_off_by_the_length_limit_is_told_to_the_model(tmp_path):
    cut = call("Write", '{"file_path": "big.txt", "content": "aaaa')
    model = scripted(reply(tool_calls=[cut], finish_reason="length"), reply("ok"))
    outcome, messages, *_ = run(model, tmp_path)
    assert messages[3]["content"] == agent.CUT_OFF and not (tmp_path / "big.txt").exists()
    assert outcome.answer == "ok"


def test_final_text_cut_off_is_printed_with_a_warning(tmp_path):
    outcome, _, events, _ = run(scripted(reply("partial answ", finish_reason="length")), tmp_path)
    assert outcome.answer == "partial answ"
    assert {"type": "notice", "text": "the answer was cut off at the model's output token limit"} in events


def test_content_filter_fails_clearly(tmp_path):
    with pytest.raises(agent.ApiError, match="content filter"):
        run(scripted(reply("", finish_reason="content_filter")), tmp_path)


def test_malformed_calls_keep_the_conversation_valid(tmp_path):
    calls = [{"type": "function", "function": {"name": "Bash", "arguments": '{"command": "echo 1"}'}},
             call("Bash", {"command": "echo 2"}, id="dup"), call("Bash", {"command": "echo 3"}, id="dup"),
             {"id": "nofn", "type": "function"}]
    model = scripted(reply(tool_calls=calls), reply("ok"))
    outcome, messages, *_ = run(model, tmp_path)
    assert outcome.answer == "ok" and every_call_answered_once(messages)
    contents = [m["content"] for m in messages[3:7]]
    assert contents[:3] == ["1\n[exit code 0]", "2\n[exit code 0]", "3\n[exit code 0]"]
    assert contents[3].startswith("Error: no tool called missing_name")


def test_context_overflow_shrinks_old_results_and_retries(tmp_path):
    (tmp_path / "big.txt").write_text(("x" * 99 + "\n") * 50)
    overflow = agent.ContextOverflow("HTTP 400: maximum context length exceeded")
    model = scripted(reply(tool_calls=[call("Read", {"file_path": "big.txt"})]), overflow, reply("fits now"))
    outcome, messages, events, _ = run(model, tmp_path)
    assert outcome.answer == "fits now"
    assert model.sent[2]["messages"][3]["content"].startswith("[removed to fit the context window: 5000 characters")
    assert any(e["type"] == "notice" and "too long" in e["text"] for e in events)


def test_context_overflow_with_nothing_to_shrink_fails(tmp_path):
    with pytest.raises(agent.ContextOverflow):
        run(scripted(agent.ContextOverflow("too long")), tmp_path)


def test_events_describe_each_tool_call(tmp_path):
    model = scripted(reply(tool_calls=[call("Bash", {"command": "exit 1"}, id="c9")]), reply("ok"))
    _, _, events, _ = run(model, tmp_path)
    kinds = [e["type"] for e in events]
    assert kinds == ["request", "assistant", "tool_call", "tool_result", "request", "assistant"]
    result = events[3]
    assert result["id"] == "c9" and result["name"] == "Bash" and result["is_error"] is False
    assert result["content"] == "(no output)\n[exit code 1]" and result["seconds"] >= 0


@pytest.mark.parametrize("parts, answer", [
    ([{"type": "text", "text": "two "}, {"type": "text", "text": "parts"}], "two parts"),
    ([{"type": "text", "text": None}, {"type": "text", "text": "the rest"}], "the rest"),
])
def test_content_parts_are_joined_into_the_answer(tmp_path, parts, answer):
    outcome, *_ = run(scripted(reply(parts)), tmp_path)
    assert outcome.answer == answer


def test_blank_lines_around_the_answer_are_dropped_but_indentation_kept(tmp_path):
    outcome, messages, *_ = run(scripted(reply("\n\n  indented\nanswer\n\n")), tmp_path)
    assert outcome.answer == "  indented\nanswer"
    assert messages[-1]["content"] == "\n\n  indented\nanswer\n\n"  # the conversation keeps it as it came


@pytest.mark.parametrize("tokens", ["lots", float("inf"), [100], None])
def test_a_usage_that_is_not_a_number_is_no_crash(tmp_path, tokens):
    """usage.prompt_tokens comes from the server: "lots", 1e400 (inf) or a list once ended the run as an
    internal error, while the usage totals already ignored it."""
    odd = {"prompt_tokens": tokens, "completion_tokens": 5}
    model = scripted(reply(tool_calls=[call("Bash", {"command": "echo hi"})], usage=odd), reply("done", usage=odd))
    outcome, messages, events, usage = run(model, tmp_path)
    assert outcome == agent.Outcome("done", "success", 2)
    assert usage.requests == 2 and usage.prompt_tokens == 0 and usage.completion_tokens == 10
