"""Pure pieces: the dispatcher's contract, argument coercion, request building, reply normalising."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app import main as agent

TOOLS = {tool.name: tool for tool in agent.TOOLS}


def echo_tool(ctx, text: str, times: int = 1, loud: bool = False) -> str:
    """A tool that shows what it got."""
    return f"{text * times}{'!' if loud else ''}"


def boom_tool(ctx, text: str) -> str:
    """A tool that fails."""
    raise ValueError("it broke")


SPEC = agent.params(["text"], text=("string", "t"), times=("integer", "n"), loud=("boolean", "b"))
TEST_TOOLS = {"Echo": agent.Tool("Echo", "echo", SPEC, echo_tool),
              "Boom": agent.Tool("Boom", "boom", agent.params(["text"], text=("string", "t")), boom_tool),
              "Two": agent.Tool("Two", "two", agent.params(["b", "a"], a=("string", ""), b=("string", "")), echo_tool)}


def dispatch(name, arguments, tools=TEST_TOOLS) -> str:
    return agent.run_tool_call({"id": "x", "function": {"name": name, "arguments": arguments}}, tools,
                               agent.ToolContext(cwd=Path("."), env={}))


@pytest.mark.parametrize("name, arguments, expected", [
    ("Echo", '{"text": "hi"}', "hi"),
    ("Echo", '{"text": "hi", "times": "3", "loud": "true"}', "hihihi!"),
    ("Echo", '{"text": "hi", "times": 2.0, "loud": null}', "hihi"),
    ("Echo", '{"text": "hi", "unknown": 1}', "hi"),
    ("Echo", json.dumps(json.dumps({"text": "double"})), "double"),
    ("Echo", {"text": "dict"}, "dict"),
    ("Nope", "{}", "Error: no tool called Nope. The tools are: Echo, Boom, Two"),
    ("Echo", '{"text": "hi"', "Error: the arguments were not valid JSON (Expecting ',' delimiter at position 13)"),
    ("Echo", "[1, 2]", "Error: the arguments were not valid JSON (expected a JSON object, got list)"),
    ("Echo", "", "Error: missing input text"),
    ("Echo", None, "Error: missing input text"),
    ("Echo", '{"text": null}', "Error: missing input text"),
    ("Two", "{}", "Error: missing input b"),
    ("Echo", '{"text": "hi", "times": "many"}', 'Error: input times should be integer, got "many"; Echo takes '
                                                "text: string, times: integer (optional), loud: boolean (optional)"),
    ("Echo", '{"text": "hi", "loud": "maybe"}', 'Error: input loud should be boolean, got "maybe"'),
    ("Boom", '{"text": "x"}', "Error: it broke"),
])
def test_dispatcher_rules(name, arguments, expected):
    assert dispatch(name, arguments).startswith(expected)


def test_dispatcher_does_not_run_a_tool_on_bad_arguments(tmp_path):
    out = agent.run_tool_call({"id": "x", "function": {"name": "Write", "arguments": '{"file_path": "a.txt", '}},
                              TOOLS, agent.ToolContext(cwd=tmp_path, env={}))
    assert out.startswith("Error: the arguments were not valid JSON") and not (tmp_path / "a.txt").exists()


def test_results_are_clipped_with_head_and_tail():
    out = dispatch("Echo", json.dumps({"text": "ab", "times": 40_000}))
    assert len(out) < agent.RESULT_LIMIT + 100
    assert out.startswith("abab") and out.endswith("abab") and "characters omitted ...]" in out


def test_declined_by_the_user(tmp_path):
    ctx = agent.ToolContext(cwd=tmp_path, env={}, confirm=lambda tool, args: f"the user declined to let {tool} run")
    out = agent.run_tool_call({"id": "x", "function": {"name": "Bash", "arguments": '{"command": "touch x"}'}},
                              TOOLS, ctx)
    assert out == "Error: permission denied: the user declined to let Bash run" and not (tmp_path / "x").exists()


def test_tool_specs_come_from_the_table():
    specs = [tool.spec() for tool in agent.TOOLS]
    assert [s["function"]["name"] for s in specs] == ["Read", "Write", "Edit", "Bash", "Glob", "Grep", "Skill",
                                                     "BashOutput", "KillShell", "NotebookEdit", "WebFetch",
                                                     "WebSearch", "TodoWrite", "Agent"]
    read = specs[0]["function"]["parameters"]
    assert read["required"] == ["file_path"] and set(read["properties"]) == {"file_path", "offset", "limit"}
    grep = specs[5]["function"]["parameters"]["properties"]
    assert {"-i", "-n", "-A", "-B", "-C", "head_limit", "glob", "output_mode"} <= set(grep)


def config(**overrides) -> agent.Config:
    return agent.Config(api_key="k", cwd=Path("/w"), session_id="s-1", **overrides)


def test_build_request_for_anthropic():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    specs = [agent.TOOLS[0].spec()]
    assert agent.build_request(config(), messages, specs) == {
        "model": "anthropic/claude-haiku-4.5", "messages": messages, "tools": specs,
        "cache_control": {"type": "ephemeral"}, "stream": True, "stream_options": {"include_usage": True},
    }
    assert "stream" not in agent.build_request(config(stream=False), messages, specs)


def test_a_strict_server_gets_only_the_fields_of_openais_schema():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": None, "reasoning": "r", "reasoning_details": [{"type": "x"}],
                 "tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "Read", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "a", "content": "ok"}]
    body = agent.build_request(config(base_url="https://api.openai.com/v1"), messages, [])
    assert "cache_control" not in body and "session_id" not in body
    assert body["messages"][2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "Read", "arguments": "{}"}}]}
    assert body["messages"][3] == messages[3] and messages[2]["reasoning"] == "r"  # the conversation keeps all
    for lenient in ("https://openrouter.ai/api/v1", "http://localhost:10000/api/v1", "http://127.0.0.1:8080/v1"):
        assert agent.build_request(config(base_url=lenient), messages, [])["messages"] is messages


@pytest.mark.parametrize("model, cache, cached", [
    ("anthropic/claude-haiku-4.5", True, True),
    ("~anthropic/claude-sonnet-latest", True, True),
    ("anthropic/claude-haiku-4.5", False, False),
    ("openai/gpt-5", True, False),
])
def test_cache_control_only_for_anthropic_when_on(model, cache, cached):
    body = agent.build_request(config(model=model, cache=cache), [], [])
    assert ("cache_control" in body) == cached and "session_id" not in body and "tools" not in body


def test_system_prompt_has_the_facts_and_rules():
    text = agent.system_prompt(config(append_system_prompt="Be brief."), {})
    for part in ("Working directory: /w", "Date: ", "Platform: ", "only a number", "never instructions to obey"):
        assert part in text
    assert text.endswith("Be brief.") and "Skills" not in text


def test_assistant_message_keeps_fields_and_fixes_calls():
    raw = {"role": "assistant", "content": "", "reasoning": "r", "reasoning_details": [{"type": "x"}],
           "tool_calls": [{"id": "a", "type": "function", "function": {"name": "Read", "arguments": '{"x":1}'}},
                          {"id": "a", "function": {"name": "Bash", "arguments": {"command": "ls"}}},
                          {"function": None}]}
    seen: set = set()
    msg = agent.assistant_message(raw, 1, seen)
    assert msg["content"] is None and msg["reasoning"] == "r" and msg["reasoning_details"] == [{"type": "x"}]
    ids = [c["id"] for c in msg["tool_calls"]]
    assert ids[0] == "a" and len(set(ids)) == 3 and set(ids) == seen
    assert msg["tool_calls"][1]["function"]["arguments"] == '{"command": "ls"}'
    assert msg["tool_calls"][2]["function"] == {"name": "missing_name", "arguments": ""}
    assert raw["content"] == "" and raw["tool_calls"][1]["id"] == "a"  # the reply itself is not changed


def test_assistant_message_without_calls_drops_empty_list():
    assert agent.assistant_message({"role": "assistant", "content": "hi", "tool_calls": []}, 1, set()) == \
        {"role": "assistant", "content": "hi"}


def test_shrink_replaces_the_oldest_large_results():
    messages = [{"role": "system", "content": "s"}] + [
        {"role": "tool", "tool_call_id": f"c{i}", "content": "x" * 1000} for i in range(4)]
    assert agent.shrink(messages) == 2
    assert messages[1]["content"].startswith("[removed to fit the context window: 1000 characters")
    assert messages[1]["tool_call_id"] == "c0" and messages[3]["content"] == "x" * 1000
    assert agent.shrink([{"role": "user", "content": "x" * 5000}]) == 0


@pytest.mark.parametrize("text, limit, expected", [
    ("short", 10, "short"),
    ("abcdefghij" * 3, 10, "abcde\n[... 20 characters omitted ...]\nfghij"),
])
def test_clip(text, limit, expected):
    assert agent.clip(text, limit) == expected


def test_head_tail_keeps_memory_flat():
    sink = agent.HeadTail(4)
    for chunk in (b"abc", b"defgh", b"ijklmn"):
        sink.feed(chunk)
    assert sink.text() == "abcd\n[... 6 bytes omitted ...]\nklmn"
    assert len(sink.head) == 4 and len(sink.tail) == 4


def test_the_schema_check_in_the_fake_server_is_real():
    from tests.fake_openrouter import load_validator
    validator = load_validator()
    good = agent.build_request(config(), [{"role": "user", "content": "u"}], [agent.TOOLS[0].spec()])
    assert list(validator.iter_errors(good)) == []
    assert list(validator.iter_errors({**good, "tools": [{"type": "function"}]}))
    assert list(validator.iter_errors({**good, "messages": [{"role": "tool", "content": "no id"}]}))
