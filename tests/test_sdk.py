"""The Agent SDK's protocol and `claude -p` fidelity: real SDK programs (claude-agent-sdk with cli_path naming
./your_program.sh) against the fake OpenRouter, the output shapes scripts read, and the pieces in-process."""

from __future__ import annotations

import functools
import io
import json
import os
import subprocess
import time
import types

import anyio
import pytest
from claude_agent_sdk import (ClaudeAgentOptions, ClaudeSDKClient, HookMatcher, PermissionResultAllow,
                              PermissionResultDeny, TextBlock, ToolUseBlock, create_sdk_mcp_server, query, tool)

from app import main as agent
from tests.conftest import PROGRAM
from tests.fake_openrouter import Raw, Stream, call, last_result, reply, tool_results, tool_then

# --- Real SDK programs ----------------------------------------------------------------------------


def options(server, workspace, **kwargs) -> ClaudeAgentOptions:
    """The SDK's options for running solo in the workspace against the fake server."""
    home = workspace.parent / "home"
    home.mkdir(exist_ok=True)
    env = {"OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "sk-test-secret-123", "HOME": str(home)}
    return ClaudeAgentOptions(cli_path=str(PROGRAM), cwd=str(workspace), env=env, **kwargs)


def collect(prompt: str, opts: ClaudeAgentOptions) -> list:
    """Every message of one query()."""
    async def run() -> list:
        return [message async for message in query(prompt=prompt, options=opts)]
    return anyio.run(run)


def test_query_runs_a_tool_and_ends_with_a_result(serve, workspace):
    server = serve(tool_then([call("Bash", {"command": "echo hi"}, id="c1")], "done"))
    messages = collect("say hi", options(server, workspace, permission_mode="bypassPermissions"))
    assert [type(m).__name__ for m in messages] == ["SystemMessage", "SystemMessage", "AssistantMessage",
                                                    "UserMessage", "SystemMessage", "AssistantMessage",
                                                    "ResultMessage"]
    assert [m.subtype for m in messages if type(m).__name__ == "SystemMessage"] == ["init", "status", "status"]
    init, _, use, result_message, _, answer, result = messages
    assert init.subtype == "init" and init.data["claude_code_version"] == agent.CLAUDE_CODE_PROTOCOL
    assert init.data["permissionMode"] == "bypassPermissions" and "Bash" in init.data["tools"]
    assert use.content == [ToolUseBlock(id="c1", name="Bash", input={"command": "echo hi"})]
    assert use.model == "anthropic/claude-4.5-haiku-20251001" and use.message_id.startswith("msg_")
    assert result_message.content[0].content == "hi\n[exit code 0]"  # the text the model read; Claude Code's object:
    assert result_message.tool_use_result == {"stdout": "hi", "stderr": "", "interrupted": False}
    assert answer.content == [TextBlock(text="done")] and answer.usage["cache_read_input_tokens"] == 50
    assert (result.subtype, result.is_error, result.result, result.num_turns) == ("success", False, "done", 2)
    assert result.stop_reason == "end_turn" and result.session_id == init.data["session_id"]
    assert result.usage["input_tokens"] == 60 and result.total_cost_usd == pytest.approx(0.002)


def test_without_a_callback_default_mode_denies_what_would_need_a_question(serve, workspace):
    server = serve(tool_then([call("Bash", {"command": "touch made"}, id="c1")], last_result))
    result = collect("make a file", options(server, workspace))[-1]
    assert not (workspace / "made").exists()
    assert result.permission_denials == [{"tool_name": "Bash", "tool_use_id": "c1",
                                          "tool_input": {"command": "touch made"}}]
    assert result.result == "Claude requested permissions to use Bash, but you haven't granted it yet."


def slow_or_echo(body: dict):
    """A model that streams slowly when asked to, calls tools when asked to, and otherwise names the model."""
    last = body["messages"][-1]
    text = json.dumps(last["content"])
    if last["role"] == "tool":
        return reply("tool said: " + last["content"])
    if "slowly" in text:
        return Stream([{"choices": [{"index": 0, "delta": {"content": "partial "}}]}, 3,
                       {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, "data: [DONE]\n\n"])
    if "write" in text:
        return reply(tool_calls=[call("Write", {"file_path": "w.txt", "content": "x"}, id="w1")])
    if "delete" in text:
        return reply(tool_calls=[call("Bash", {"command": "rm -f keep.txt"}, id="d1")])
    if "shout" in text:
        return reply(tool_calls=[call("Bash", {"command": "echo quiet"}, id="s1")])
    if "add" in text:
        return reply(tool_calls=[call("mcp__calc__add", {"a": 2, "b": 3}, id="a1")])
    return reply(f"model {body['model']}, {len(body['messages'])} messages")


def test_a_client_over_several_turns_with_mode_model_interrupt_and_an_unsupported_request(serve, workspace):
    server = serve(slow_or_echo, accept="")
    seen: dict = {}

    async def run() -> None:
        async with ClaudeSDKClient(options=options(server, workspace, model="claude-haiku-4-5")) as client:
            await client.query("hello")
            seen["first"] = [m async for m in client.receive_response()]
            await client.set_permission_mode("acceptEdits")
            await client.set_model("openai/gpt-4o")  # not Anthropic's
            await client.query("write a file")
            seen["second"] = [m async for m in client.receive_response()]
            await client.query("answer slowly")
            async with anyio.create_task_group() as group:
                async def interrupt() -> None:
                    await anyio.sleep(0.5)
                    started = time.monotonic()
                    await client.interrupt()
                    seen["ack"] = time.monotonic() - started
                group.start_soon(interrupt)
                seen["third"] = [m async for m in client.receive_response()]
            started = time.monotonic()
            with pytest.raises(Exception, match="Unsupported control request subtype: get_context_usage"):
                await client.get_context_usage()
            seen["refusal"] = time.monotonic() - started
            await client.query("hello again")
            seen["fourth"] = [m async for m in client.receive_response()]

    anyio.run(run)
    first, second, third, fourth = seen["first"], seen["second"], seen["third"], seen["fourth"]
    assert first[2].content == [TextBlock(text="model anthropic/claude-haiku-4.5, 2 messages")]
    assert second[0].data["permissionMode"] == "acceptEdits" and second[0].data["model"] == "openai/gpt-4o"
    assert (workspace / "w.txt").read_text() == "x" and server.bodies[1]["model"] == "openai/gpt-4o"
    assert "cache_control" not in server.bodies[1]  # only Anthropic's models are asked to cache
    assert seen["ack"] < 1 and seen["refusal"] < 1
    assert third[1].subtype == "status"  # system/status before each request
    aborted, interruption, result = third[2:]
    assert aborted.content == [TextBlock(text="partial ")]
    assert interruption.content == [TextBlock(text="[Request interrupted by user]")]
    assert (result.subtype, result.is_error, result.terminal_reason) == ("error_during_execution", True,
                                                                           "aborted_streaming")
    assert fourth[-1].subtype == "success" and fourth[-1].result.startswith("model openai/gpt-4o")
    sent = server.bodies[-1]["messages"]  # one conversation: the interruption is in it, the next prompt after it
    assert [m["content"] for m in sent[-2:]] == ["[Request interrupted by user]", "hello again"]


def test_can_use_tool_hooks_and_an_in_process_mcp_tool(serve, workspace):
    (workspace / "keep.txt").write_text("precious")
    server = serve(slow_or_echo)
    asked, hooked = [], []

    @tool("add", "Add two numbers", {"a": int, "b": int})
    async def add(args):
        return {"content": [{"type": "text", "text": str(args["a"] + args["b"])}]}

    async def can_use_tool(name, tool_input, context):
        asked.append((name, tool_input, context.tool_use_id))
        if name == "Bash" and "rm" in tool_input["command"]:
            return PermissionResultDeny(message="deleting is not allowed")
        if name == "Bash":
            return PermissionResultAllow(updated_input={"command": "echo LOUD"})
        return PermissionResultAllow()

    async def pre(hook_input, tool_use_id, context):
        hooked.append(("pre", hook_input["hook_event_name"], hook_input["tool_name"], tool_use_id))
        return {}

    async def post(hook_input, tool_use_id, context):
        hooked.append(("post", hook_input["hook_event_name"], hook_input["tool_name"], tool_use_id))
        return {}

    opts = options(server, workspace, can_use_tool=can_use_tool,
                   mcp_servers={"calc": create_sdk_mcp_server("calc", tools=[add])},
                   hooks={"PreToolUse": [HookMatcher(matcher="Bash", hooks=[pre])],
                          "PostToolUse": [HookMatcher(matcher="Bash", hooks=[post])]})
    results = {}

    async def run() -> None:
        async with ClaudeSDKClient(options=opts) as client:
            for prompt in ("delete keep.txt", "shout", "add 2 and 3"):
                await client.query(prompt)
                results[prompt] = [m async for m in client.receive_response()][-1]

    anyio.run(run)
    assert (workspace / "keep.txt").read_text() == "precious"
    denied = results["delete keep.txt"]
    assert denied.result == "tool said: deleting is not allowed" and denied.permission_denials[0]["tool_use_id"] == "d1"
    assert results["shout"].result == "tool said: LOUD\n[exit code 0]"
    assert results["add 2 and 3"].result == "tool said: 5"
    assert [a[0] for a in asked] == ["Bash", "Bash", "mcp__calc__add"] and asked[0][2] == "d1"
    assert ("pre", "PreToolUse", "Bash", "s1") in hooked and ("post", "PostToolUse", "Bash", "s1") in hooked


def test_a_401_and_unknown_flags(serve, workspace):
    server = serve(lambda body: Raw(401, {"error": {"code": 401, "message": "No auth credentials found"}}))
    lines: list[str] = []
    opts = options(server, workspace, stderr=lines.append, extra_args={"frobnicate": "7", "new-flag": None})
    messages: list = []

    async def run() -> None:
        async for message in query(prompt="hi", options=opts):
            messages.append(message)

    with pytest.raises(Exception, match="HTTP 401: No auth credentials found"):
        anyio.run(run)
    result = messages[-1]
    assert (result.subtype, result.is_error, result.api_error_status) == ("success", True, 401)
    assert any("ignored what this solo does not know: --frobnicate --new-flag 7" in line for line in lines)


# --- claude -p output, read as scripts read it ------------------------------------------------------


def tool_then_answer(body):
    """Run `echo hi` once, then answer."""
    if body["messages"][-1]["role"] == "user":
        return reply("Let me look.", tool_calls=[call("Bash", {"command": "echo hi"}, id="c1")])
    return reply("the answer")


def test_stream_json_shapes_as_jq_recipes_read_them(serve, run, workspace):
    server = serve(tool_then_answer)
    result = run(["-p", "--output-format", "stream-json", "--verbose", "--include-partial-messages", "q"],
                 cwd=workspace, base_url=server.url)
    events = [json.loads(line) for line in result.stdout.splitlines()]
    # jq 'select(.type == "assistant") | .message.content[] | select(.type == "text") | .text'
    texts = [b["text"] for e in events if e["type"] == "assistant"
             for b in e["message"]["content"] if b["type"] == "text"]
    assert texts == ["Let me look.", "the answer"]
    assistant = [e for e in events if e["type"] == "assistant"]
    assert [len(e["message"]["content"]) for e in assistant] == [1, 1, 1]  # one line per content block
    assert assistant[0]["message"]["id"] == assistant[1]["message"]["id"] != assistant[2]["message"]["id"]
    assert all(e["message"]["stop_reason"] is None for e in assistant)
    assert set(assistant[0]["message"]["usage"]) == {"input_tokens", "output_tokens", "cache_read_input_tokens",
                                                     "cache_creation_input_tokens"}
    stream = [e["event"] for e in events if e["type"] == "stream_event"]
    kinds = [s["type"] for s in stream]
    assert kinds[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert kinds.count("message_start") == kinds.count("message_stop") == 2
    starts = [s["content_block"] for s in stream if s["type"] == "content_block_start"]
    assert starts[1] == {"type": "tool_use", "id": "c1", "name": "Bash", "input": {}}
    partial = "".join(s["delta"]["partial_json"] for s in stream if s["type"] == "content_block_delta"
                      and s["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == {"command": "echo hi"}
    assert [s["delta"]["stop_reason"] for s in stream if s["type"] == "message_delta"] == ["tool_use", "end_turn"]
    user = next(e for e in events if e["type"] == "user")
    assert user["tool_use_result"] == {"stdout": "hi", "stderr": "", "interrupted": False}
    last = events[-1]  # jq '.result', '.total_cost_usd', '.usage | .input_tokens + .cache_read_input_tokens'
    assert (last["type"], last["result"], last["terminal_reason"], last["stop_reason"]) == (
        "result", "the answer", "completed", "end_turn")
    assert last["usage"]["input_tokens"] + last["usage"]["cache_read_input_tokens"] == 160
    assert isinstance(last["ttft_ms"], int) and "errors" not in last
    init = events[0]
    assert {"claude_code_version", "apiKeySource", "slash_commands", "agents", "skills"} <= set(init)


def test_json_verbose_is_the_array_of_every_event(serve, run, workspace):
    server = serve(tool_then_answer)
    result = run(["-p", "q", "--output-format", "json", "--verbose"], cwd=workspace, base_url=server.url)
    events = json.loads(result.stdout)  # jq '.[-1].result', jq 'map(.type)'
    assert [e["type"] for e in events] == ["system", "system", "assistant", "assistant", "user", "system", "assistant",
                                           "result"]
    assert events[-1]["result"] == "the answer"


def sub_agents(body: dict) -> dict | Raw:
    """Four sub-agents at once, each looks around once and answers; the last one's second request fails."""
    task, last = body["messages"][1]["content"], body["messages"][-1]
    if task == "main":
        if last["role"] == "user":
            return reply(tool_calls=[call("Agent", {"description": f"d{n}", "prompt": f"sub {n}"}, id=f"agent{n}")
                                     for n in range(4)])
        return reply("all done")
    if last["role"] == "user":
        time.sleep(0.05)  # the four are under way together
        return reply(f"looking {task}", tool_calls=[call("Glob", {"pattern": "*"}, id=f"glob-{task[-1]}")])
    if task == "sub 3":
        return Raw(400, {"error": {"code": 400, "message": "the provider refused"}})
    return reply(f"{task} answer")


def test_stream_json_streams_each_sub_agents_messages_under_its_agent_call(serve, run, workspace):
    server = serve(sub_agents)
    result = run(["-p", "main", "--output-format", "stream-json", "--verbose", "--include-partial-messages"],
                 cwd=workspace, base_url=server.url)
    events = [json.loads(line) for line in result.stdout.splitlines()]  # each line one whole object
    assert events[-1]["result"] == "all done" and events[-1]["usage"]["requests"] == 9
    top = [e for e in events if e["type"] in ("assistant", "user", "stream_event") and e["parent_tool_use_id"] is None]
    kinds = [e["event"]["type"] for e in top if e["type"] == "stream_event"]
    assert kinds.count("message_start") == kinds.count("message_stop") == 2  # the main stream, undisturbed
    answers = {b["tool_use_id"]: b for e in top if e["type"] == "user" for b in e["message"]["content"]}
    assert [answers[f"agent{n}"]["content"] for n in range(3)] == [f"sub {n} answer" for n in range(3)]
    assert answers["agent3"]["is_error"] and "the provider refused" in answers["agent3"]["content"]
    for n in range(4):
        mine = [e for e in events if e.get("parent_tool_use_id") == f"agent{n}"]
        blocks = [(e["type"], b.get("text") or b.get("name") or b.get("content")) for e in mine
                  for b in e["message"]["content"]]
        assert blocks == [("user", f"sub {n}"), ("assistant", f"looking sub {n}"), ("assistant", "Glob"),
                          ("user", blocks[3][1])] + [("assistant", f"sub {n} answer")] * (n < 3)
        assert mine[3]["message"]["content"][0]["tool_use_id"] == f"glob-{n}"
        ids = [e["message"]["id"] for e in mine if e["type"] == "assistant"]  # one per reply, shared by its blocks
        assert ids[0] == ids[1] and len(set(ids)) == 1 + (n < 3)
        assert all(e["session_id"] == events[0]["session_id"] for e in mine)
    last_use = max(i for i, e in enumerate(events) if e.get("parent_tool_use_id"))
    assert all(e["type"] != "result" for e in events[:last_use])  # a sub-agent's lines come before the result


def test_the_sdk_sees_which_agent_call_each_sub_agent_message_belongs_to(serve, workspace):
    server = serve(sub_agents)
    messages = collect("main", options(server, workspace))
    parents = {m.parent_tool_use_id for m in messages if type(m).__name__ in ("AssistantMessage", "UserMessage")}
    assert parents == {None, "agent0", "agent1", "agent2", "agent3"} and messages[-1].result == "all done"


@pytest.mark.parametrize("flags, subtype, errors, reason", [
    (["--max-turns", "2"], "error_max_turns", ["Reached maximum number of turns (2)"], "max_turns"),
    (["--max-budget-usd", "0.001"], "error_max_budget_usd", ["Reached maximum budget ($0.001)"], "budget_exhausted"),
])
def test_limits_name_themselves_in_errors_and_keep_exit_code_3(serve, run, workspace, flags, subtype, errors, reason):
    server = serve(lambda body: reply(tool_calls=[call("Bash", {"command": "true"})]))
    result = run(["-p", "q", "--output-format", "json", *flags], cwd=workspace, base_url=server.url)
    obj = json.loads(result.stdout)
    assert result.code == 3 and (obj["subtype"], obj["errors"], obj["terminal_reason"]) == (subtype, errors, reason)


def test_json_schema_asks_for_response_format_and_fills_structured_output(serve, run, workspace):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    server = serve(lambda body: reply('{"n": 42}'))
    result = run(["-p", "q", "--output-format", "json", "--json-schema", json.dumps(schema), "--effort", "low"],
                 cwd=workspace, base_url=server.url)
    assert json.loads(result.stdout)["structured_output"] == {"n": 42}
    body = server.bodies[0]
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "strict": True,
                                                                              "schema": schema}}
    assert body["reasoning"] == {"effort": "low"}


@pytest.mark.parametrize("args, stdin, prompt", [
    (["-p", "--output-format", "json", "hi there"], None, "hi there"),
    (["-p"], "from stdin", "from stdin"),
    (["--print=-dash first"], None, "-dash first"),
    (["hi", "--dangerously-skip-permissions"], None, "hi"),  # no terminal: answered at once
])
def test_p_is_a_flag_and_the_prompt_an_argument(serve, workspace, args, stdin, prompt):
    server = serve(lambda body: reply("ok"))
    env = {**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "k"}
    proc = subprocess.run([str(PROGRAM), *args], input=stdin, capture_output=True, text=True, cwd=workspace, env=env,
                          stdin=None if stdin is not None else subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert server.bodies[0]["messages"][1]["content"] == prompt


# --- In-process -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, model", [
    ("sonnet", "anthropic/claude-sonnet-4.5"), ("opus", "anthropic/claude-opus-4.5"),
    ("haiku", "anthropic/claude-haiku-4.5"),
    ("claude-haiku-4-5", "anthropic/claude-haiku-4.5"), ("claude-sonnet-4-5-20250929", "anthropic/claude-sonnet-4.5"),
    ("claude-3-7-sonnet-latest", "anthropic/claude-3.7-sonnet"), ("claude-opus-4-1", "anthropic/claude-opus-4.1"),
    ("openai/gpt-4o", "openai/gpt-4o"), ("anthropic/claude-haiku-4.5", "anthropic/claude-haiku-4.5"),
])
def test_model_names_map_to_openrouter_ids(name, model):
    assert agent.model_id(name) == model


def test_unknown_flags_are_kept_in_sdk_mode_and_refused_elsewhere():
    sdk = ["--output-format", "stream-json", "--verbose", "--betas", "x", "--new=1", "--input-format", "stream-json"]
    assert agent.parse_args(sdk).unknown == ["--betas", "--new=1", "x"]
    with pytest.raises(agent.UsageError, match="unrecognized arguments: --betas"):
        agent.parse_args(["-p", "q", "--betas", "x"])
    with pytest.raises(agent.UsageError, match="a prompt that starts with -- goes after --"):
        agent.parse_args(["-p", "--fix"])


def test_the_anthropic_stream_of_a_reply_with_text_and_a_tool_call():
    stream = agent.AnthropicStream()
    events = stream.feed({"role": "assistant", "content": "Hi"}, "m")
    events += stream.feed({"tool_calls": [{"index": 0, "id": "t1", "function": {"name": "Read", "arguments": ""}}]},
                          "m")
    events += stream.feed({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":1}'}}]}, "m")
    events += stream.finish("tool_calls", {"prompt_tokens": 10, "completion_tokens": 2})
    assert events[0]["type"] == "message_start" and events[0]["message"]["id"].startswith("msg_")
    assert events[1:] == [
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t1", "name": "Read",
                                                                      "input": {}}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"a":1}'}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
         "usage": {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                   "output_tokens": 2}},
        {"type": "message_stop"}]


def link(lines: list[dict], handlers=None):
    """An SdkLink reading these lines, writing to a StringIO."""
    cfg = agent.Config(api_key="k", cwd=agent.Path("/"))
    out = io.StringIO()
    stdin = io.StringIO("".join(json.dumps(x) + "\n" for x in lines))
    sdk = agent.SdkLink(agent.ClaudeOutput(cfg, out, array=False), stdin, handlers or {}, lambda text: None)
    return sdk, out


def test_the_stdin_thread_routes_prompts_control_requests_and_answers():
    prompt = {"type": "user", "message": {"role": "user", "content": "hi"}}
    sdk, out = link([{"type": "control_request", "request_id": "r1", "request": {"subtype": "initialize"}},
                     {"type": "control_request", "request_id": "r2", "request": {"subtype": "rewind_files"}}, prompt],
                    {"initialize": lambda request: {"pid": 1}})
    sdk.read()
    assert [sdk.prompts.get(), sdk.prompts.get()] == [prompt, None]  # the end of stdin ends the queue
    assert [json.loads(line) for line in out.getvalue().splitlines()] == [
        {"type": "control_response", "response": {"subtype": "success", "request_id": "r1", "response": {"pid": 1}}},
        {"type": "control_response", "response": {"subtype": "error", "request_id": "r2",
                                                  "error": "Unsupported control request subtype: rewind_files"}}]
    with pytest.raises(agent.AgentError, match="stdin is closed"):  # no 60 s wait for an SDK that is gone
        sdk.request("can_use_tool", {})


def test_bad_stdin_lines_each_fail_alone_and_the_run_goes_on(serve, run, workspace, tmp_path):
    """A line nested too deeply is skipped; a prompt whose message is a string or a list is an error for that prompt;
    a byte that is not UTF-8 is replaced even with PYTHONIOENCODING=utf-8; set_model with an object is refused."""
    def model(body):
        content = body["messages"][-1]["content"]
        return reply("ok: " + (content if isinstance(content, str) else content[0]["text"]))
    server = serve(model)
    prompt = lambda text: json.dumps({"type": "user", "message": {"role": "user", "content": text}}).encode() + b"\n"
    lines = [b"[" * 100_000 + b"]" * 100_000 + b"\n", b'{"type": "user", "message": "a string"}\n',
             b'{"type": "user", "message": ["a", "list"]}\n', prompt("caf\u00e9").replace(b"\\u00e9", b"\xff"),
             b'{"type": "control_request", "request_id": "m1", "request": {"subtype": "set_model", '
             b'"model": {"a": 1}}}\n',
             prompt("last")]
    (tmp_path / "stdin").write_bytes(b"".join(lines))
    with open(tmp_path / "stdin", "rb") as stdin:
        result = run(["--output-format", "stream-json", "--verbose", "--input-format", "stream-json"], cwd=workspace,
                     base_url=server.url, env={"PYTHONIOENCODING": "utf-8"}, stdin=stdin, timeout=60)
    events = [json.loads(line) for line in result.stdout.splitlines()]
    results = [(e["is_error"], e.get("result") or "".join(e.get("errors") or []))
               for e in events if e["type"] == "result"]
    assert result.code == 0, result.stderr
    assert [is_error for is_error, _ in results] == [True, True, False, False], results
    assert "not an object" in results[0][1] and "not an object" in results[1][1]
    assert results[2][1] == "ok: caf\ufffd" and results[3][1] == "ok: last"
    answer = next(e["response"] for e in events if e["type"] == "control_response")
    assert answer["subtype"] == "error" and "takes a model name (a string)" in answer["error"]
    assert [body["model"] for body in server.bodies] == ["anthropic/claude-haiku-4.5"] * 2
    assert result.stderr.count("skipped a line of stdin") == 1


def test_piped_stdin_with_a_bad_byte_is_read_whatever_pythonioencoding_says(serve, run, workspace, tmp_path):
    """-p reads piped stdin as bytes too: the byte is replaced, the run goes on."""
    server = serve(lambda body: reply("ok"))
    (tmp_path / "stdin").write_bytes(b"caf\xff context\n")
    with open(tmp_path / "stdin", "rb") as stdin:
        result = run(["-p", "summarize"], cwd=workspace, base_url=server.url, env={"PYTHONIOENCODING": "utf-8"},
                     stdin=stdin)
    assert (result.code, result.stdout) == (0, "ok\n"), result.stderr
    assert "caf\ufffd context" in json.dumps(server.bodies[0]["messages"], ensure_ascii=False)


def test_the_reader_ends_the_queue_whatever_ends_it():
    class Broken(io.StringIO):
        def readline(self, *args):
            raise MemoryError("a line too long to hold")
    sdk, _ = link([])
    sdk.stdin, slot = Broken(), agent.threading.Event()
    sdk.pending["r1"] = slot
    with pytest.raises(MemoryError):
        sdk.read()
    assert sdk.prompts.get(timeout=1) is None and slot.is_set() and sdk.closed


def test_set_model_with_a_value_that_is_not_a_name_is_an_error_answer():
    run = types.SimpleNamespace(changes={}, cfg=types.SimpleNamespace(aliases=()))
    sdk, out = link([{"type": "control_request", "request_id": f"r{i}", "request": {"subtype": "set_model", **model}}
                     for i, model in enumerate([{"model": {"a": 1}}, {"model": 7}, {"model": "sonnet"}, {}])],
                    {"set_model": functools.partial(agent.SdkRun.set_model, run)})
    sdk.read()
    answers = [json.loads(line)["response"] for line in out.getvalue().splitlines()]
    assert [answer.get("error") for answer in answers] == [
        'set_model takes a model name (a string) or null for the default, not {"a": 1}',
        "set_model takes a model name (a string) or null for the default, not 7", None, None]
    assert run.changes == {"model": agent.DEFAULT_MODEL}  # "sonnet", then none: the default


def test_user_content_blocks_become_text_and_image_parts():
    text, images = agent.user_content([{"type": "text", "text": "what is this?"}, {"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AAAA"}}])
    assert text == "what is this?"
    assert images == [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]


def test_a_line_over_a_megabyte_is_cut_to_fit():
    line = agent.fit_line({"type": "user", "content": "x" * 3_000_000})
    assert len(line.encode()) < agent.LINE_BYTES and json.loads(line)["type"] == "user"


def test_the_fallback_model_answers_when_the_model_fails(serve, run, workspace):
    server = serve(lambda body: reply("from " + body["model"]) if body["model"] == "anthropic/claude-haiku-4.5"
                   else Raw(404, {"error": {"code": 404, "message": "No endpoints found"}}), accept="")
    result = run(["-p", "q", "--model", "some/model", "--fallback-model", "haiku"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "from anthropic/claude-haiku-4.5\n")
    assert "some/model failed (HTTP 404: No endpoints found" in result.stderr


def test_a_prompt_argument_without_p_starts_a_session_with_it(serve, terminal):
    server = serve(lambda body: reply("fixed it"))
    session = terminal(server, "fix it")  # the answer comes before the first "> "
    assert "fixed it" in session.transcript and server.bodies[0]["messages"][1]["content"] == "fix it"
    session.send("\x04")
    assert session.wait() == 0
