"""What Agent SDK programs rely on (issue 32): the TypeScript SDK's initialize options, and the behaviours Python SDK
programs observe on Claude Code, each run for real against the fake OpenRouter (or as raw protocol lines)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from claude_agent_sdk import (AgentDefinition, ClaudeSDKClient, HookMatcher, PermissionResultDeny, TextBlock,
                              get_session_messages, list_sessions)

from app import main as agent
from tests.conftest import PROGRAM
from tests.fake_openrouter import call, last_result, reply, tool_results, tool_then
from tests.test_sdk import collect, options

HERE = Path(__file__).parent
TS_SDK = Path(os.environ.get("CLAUDE_AGENT_SDK_TS") or HERE / "node/node_modules/@anthropic-ai/claude-agent-sdk")


def ts_program(server, workspace, prompt: str, *, calc: bool = False, **options) -> list[dict]:
    """Every message a TypeScript SDK query() with solo as its CLI receives (tests/sdk_program.mjs), the last one
    {"done": true} or {"error": ...}. Skips when node or the SDK is missing (.ci/run installs it with npm)."""
    node = shutil.which("node")
    if not node or not (TS_SDK / "sdk.mjs").is_file():
        pytest.skip("the TypeScript Agent SDK is not installed (npm install --prefix tests/node "
                    "@anthropic-ai/claude-agent-sdk; or set CLAUDE_AGENT_SDK_TS to its folder)")
    home = workspace.parent / "home"
    home.mkdir(exist_ok=True)
    env = {"OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "sk-test-secret-123", "HOME": str(home),
           "PATH": os.environ["PATH"]}
    spec = {"sdk": str(TS_SDK), "cli": str(PROGRAM), "cwd": str(workspace), "env": env, "prompt": prompt,
            "calc": calc, "options": options}
    done = subprocess.run([node, str(HERE / "sdk_program.mjs"), json.dumps(spec)], capture_output=True, text=True,
                          timeout=120)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def tools_offered(body: dict) -> list[str]:
    """The names of the tools a request offers."""
    return [tool["function"]["name"] for tool in body.get("tools") or []]


# --- The TypeScript SDK's initialize options -------------------------------------------------------


def adds_then_echoes(body: dict):
    """A model that calls the in-process add and the stdio server's echo, then says what the last result was."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return reply("tool said: " + last["content"])
    return reply(tool_calls=[call("mcp__calc__add", {"a": 2, "b": 3}, id="a1"),
                             call("mcp__stdio__echo", {"text": "yo"}, id="e1")])


def test_a_typescript_program_with_an_in_process_tool_a_stdio_server_and_an_appended_prompt(serve, workspace):
    server = serve(adds_then_echoes)
    stdio = {"command": sys.executable, "args": [str(HERE / "mcp_server.py"), "--only", "echo"]}
    messages = ts_program(server, workspace, "add", calc=True, mcpServers={"stdio": stdio},
                          systemPrompt={"type": "preset", "preset": "claude_code", "append": "Always be brief."},
                          allowedTools=["mcp__calc", "mcp__stdio"])
    assert messages[-1] == {"done": True}, messages[-1]  # the SDK ends at once without mcp_servers_applied
    init, result = messages[0], messages[-2]
    assert init["subtype"] == "init" and {"mcp__calc__add", "mcp__stdio__echo"} <= set(init["tools"])
    assert {(s["name"], s["status"]) for s in init["mcp_servers"]} == {("calc", "connected"), ("stdio", "connected")}
    results = [block["content"] for m in messages if m.get("type") == "user" for block in m["message"]["content"]]
    assert results == [[{"type": "text", "text": "sum 5"}], [{"type": "text", "text": "echo: yo"}]]
    assert (result["subtype"], result["result"]) == ("success", "tool said: echo: yo")
    system = server.bodies[0]["messages"][0]["content"]
    assert system.endswith("\n\nAlways be brief.") and "solo" in system  # solo's own prompt, then the addition
    assert {"mcp__calc__add", "mcp__stdio__echo"} <= set(tools_offered(server.bodies[0]))


def test_a_typescript_program_replaces_the_prompt_defines_agents_and_asks_for_json(serve, workspace):
    server = serve(lambda body: reply('{"answer": 42}'))
    schema = {"type": "object", "properties": {"answer": {"type": "number"}}, "required": ["answer"]}
    messages = ts_program(server, workspace, "what is it?", systemPrompt="You are a calculator.",
                          agents={"reviewer": {"description": "Reviews code", "prompt": "You review.",
                                               "tools": ["Read"], "model": "haiku"}},
                          outputFormat={"type": "json_schema", "schema": schema},
                          settingsDelivery="initialize", settings={"permissions": {"deny": ["Bash"]}},
                          disallowedToolsDelivery="initialize", disallowedTools=["Write"])
    assert messages[-1] == {"done": True}, messages[-1]  # the SDK ends at once without settings_applied and the like
    init, result = messages[0], messages[-2]
    assert init["agents"] == ["general-purpose", "reviewer"]
    assert result["structured_output"] == {"answer": 42}
    body = server.bodies[0]
    assert body["messages"][0]["content"].startswith("You are a calculator.")
    assert body["response_format"]["json_schema"]["schema"] == schema
    assert not {"Bash", "Write"} & set(tools_offered(body)) and "Read" in tools_offered(body)
    agent_tool = next(t for t in body["tools"] if t["function"]["name"] == "Agent")
    assert "- reviewer: Reviews code" in agent_tool["function"]["description"]


# --- Behaviour a program relies on -----------------------------------------------------------------


def test_a_hook_that_raises_blocks_the_call_when_registered_to_block(serve, workspace):
    async def broken(data, tool_use_id, context):
        raise RuntimeError("the guard crashed")

    async def quiet(data, tool_use_id, context):
        raise RuntimeError("this one fails open")

    server = serve(tool_then([call("Bash", {"command": "touch blocked"}, id="b1"),
                              call("Write", {"file_path": "open.txt", "content": "x"}, id="w1")], last_result))
    hooks = {"PreToolUse": [HookMatcher(matcher="Bash", hooks=[broken], on_failure="block"),
                            HookMatcher(matcher="Write", hooks=[quiet])]}
    messages = collect("go", options(server, workspace, hooks=hooks, permission_mode="bypassPermissions"))
    assert not (workspace / "blocked").exists()  # the SDK refuses to start unless hook_on_failure_supported
    assert (workspace / "open.txt").read_text() == "x"  # without on_failure="block", a failing callback blocks nothing
    results = tool_results(server.bodies[1])
    assert results[0].startswith("Error: blocked by a PreToolUse hook: the hook failed") and "crashed" in results[0]
    assert messages[-1].subtype == "success"


def test_programmatic_sub_agents_beside_the_project_s(serve, workspace):
    (workspace / ".claude" / "agents").mkdir(parents=True)
    (workspace / ".claude" / "agents" / "filed.md").write_text("---\ndescription: from a file\n---\nFiled.\n")
    server = serve(lambda body: reply("reviewed") if body["messages"][0]["content"].startswith("You review.") else
                   reply("all done") if body["messages"][-1]["role"] == "tool" else
                   reply(tool_calls=[call("Agent", {"description": "review it", "prompt": "look",
                                                    "subagent_type": "reviewer"}, id="g1")]))
    reviewer = AgentDefinition(description="Reviews code", prompt="You review.", tools=["Read", "Grep"],
                               model="haiku")
    messages = collect("review", options(server, workspace, agents={"reviewer": reviewer},
                                         permission_mode="bypassPermissions"))
    assert messages[0].data["agents"] == ["general-purpose", "reviewer", "filed"]
    sub = server.bodies[1]
    assert tools_offered(sub) == ["Read", "Grep"] and sub["model"] == "anthropic/claude-haiku-4.5"
    assert tool_results(server.bodies[2]) == ["reviewed"] and messages[-1].result == "all done"


@pytest.mark.parametrize("given, error", [
    ('{"x": {"prompt": "p"}}', "agent 'x' needs a description and a prompt"),
    ('{"x": {"description": "d", "prompt": "p", "tools": "Read"}}', "agent 'x': tools is a list of tool names"),
    ("[1]", "not a JSON object of agents by name"),
])
def test_agents_of_the_wrong_shape_are_a_usage_error(run, workspace, given, error):
    result = run(["-p", "hi", "--agents", given], cwd=workspace, base_url="http://127.0.0.1:9/api/v1")
    assert result.code == 2 and f"--agents: {error}" in result.stderr


def test_a_deny_that_interrupts_ends_the_turn_as_claude_code_does(serve, workspace):
    server = serve(lambda body: reply("again") if "go on" in json.dumps(body["messages"][-1]) else
                   reply(tool_calls=[call("Bash", {"command": "touch made"}, id="c1")]))
    seen: dict = {}

    async def can_use_tool(name, tool_input, context):
        return PermissionResultDeny(message="stop right there", interrupt=True)

    async def run() -> None:
        async with ClaudeSDKClient(options=options(server, workspace, can_use_tool=can_use_tool)) as client:
            await client.query("make it")
            seen["first"] = [m async for m in client.receive_response()]
            await client.query("go on")
            seen["second"] = [m async for m in client.receive_response()]

    anyio.run(run)
    first = seen["first"]
    assert [type(m).__name__ for m in first] == ["SystemMessage", "SystemMessage", "AssistantMessage", "SystemMessage",
                                                 "UserMessage", "UserMessage", "ResultMessage"]
    assert [first[1].subtype, first[3].subtype] == ["status", "permission_denied"]
    assert first[4].content[0].content == "stop right there" and first[4].content[0].is_error
    assert first[5].content == [TextBlock(text="[Request interrupted by user for tool use]")]
    assert (first[6].subtype, first[6].is_error) == ("error_during_execution", True)
    assert len(server.bodies) == 2 and not (workspace / "made").exists()  # the model was not asked again
    assert seen["second"][-1].result == "again"
    assert server.bodies[1]["messages"][-2]["content"] == "[Request interrupted by user for tool use]"


def test_dont_ask_mode_refuses_what_would_ask_everywhere(serve, run, workspace):
    server = serve(tool_then([call("Bash", {"command": "touch made"}, id="c1"), call("Bash", {"command": "echo ok"},
                                                                                     id="c2")], last_result))
    result = run(["-p", "go", "--permission-mode", "dontAsk", "--allowedTools", "Bash(echo:*)"], cwd=workspace,
                 base_url=server.url)
    assert result.code == 0 and not (workspace / "made").exists()  # -p runs unmatched calls, but not in dontAsk
    refused, ran = tool_results(server.bodies[1])
    assert "permission mode dontAsk" in refused and ran == "ok\n[exit code 0]"


def test_set_permission_mode_auto_is_refused_naming_solo_s_modes(serve, workspace):
    server = serve(lambda body: reply("hi"))

    async def run() -> None:
        async with ClaudeSDKClient(options=options(server, workspace)) as client:
            with pytest.raises(Exception, match="auto.*classifier.*modes: default, acceptEdits, plan, "
                                                "bypassPermissions, dontAsk"):
                await client.set_permission_mode("auto")
            await client.set_permission_mode("dontAsk")
            await client.query("hi")
            assert [m async for m in client.receive_response()][0].data["permissionMode"] == "dontAsk"

    anyio.run(run)


@pytest.mark.parametrize("allowed", [False, True])
def test_switching_to_bypass_permissions_needs_the_flag_that_allows_it(serve, workspace, allowed):
    server = serve(tool_then([call("Bash", {"command": "touch made"}, id="c1")], last_result))
    extra = {"allow-dangerously-skip-permissions": None} if allowed else {}

    async def run() -> None:
        async with ClaudeSDKClient(options=options(server, workspace, extra_args=extra)) as client:
            if allowed:
                await client.set_permission_mode("bypassPermissions")
            else:
                with pytest.raises(Exception, match="not started with --dangerously-skip-permissions or "
                                                    "--allow-dangerously-skip-permissions"):
                    await client.set_permission_mode("bypassPermissions")
            await client.query("go")
            messages = [m async for m in client.receive_response()]
            assert messages[0].data["permissionMode"] == ("bypassPermissions" if allowed else "default")

    anyio.run(run)
    assert (workspace / "made").exists() == allowed


def test_a_whole_tool_deny_takes_the_tool_off_the_offer(serve, workspace):
    (workspace / ".claude").mkdir()
    (workspace / ".claude" / "settings.json").write_text(json.dumps({"permissions": {"deny": ["Bash", "Read(./x)"]}}))
    server = serve(lambda body: reply("ok"))
    messages = collect("hi", options(server, workspace, disallowed_tools=["Write", "Edit(/y)"],
                                     setting_sources=["project"]))
    offered = tools_offered(server.bodies[0])
    assert "Bash" not in offered and "Write" not in offered and {"Read", "Edit", "Grep"} <= set(offered)
    assert messages[0].data["tools"] == offered


def test_each_result_s_usage_is_its_turn_s_and_the_cost_the_session_s(serve, workspace):
    server = serve(lambda body: reply("hi"))  # each reply: 100 prompt tokens (50 cached, 20 written), 10 out, $0.001
    results = []

    async def run() -> None:
        async with ClaudeSDKClient(options=options(server, workspace)) as client:
            for prompt in ("one", "two", "three"):
                await client.query(prompt)
                results.append([m async for m in client.receive_response()][-1])

    anyio.run(run)
    assert [r.usage["input_tokens"] for r in results] == [30, 30, 30]  # summing them gives the session's 90
    assert sum(r.usage["output_tokens"] for r in results) == 30
    assert [r.total_cost_usd for r in results] == pytest.approx([0.001, 0.002, 0.003])


def test_a_budget_stop_comes_before_the_pending_tool_call_runs(serve, run, workspace):
    server = serve(lambda body: reply(tool_calls=[call("Bash", {"command": "echo x >> calls"})],
                                      usage={"prompt_tokens": 5, "completion_tokens": 5, "cost": 0.02}))
    result = run(["-p", "spend", "--max-budget-usd", "0.05", "--output-format", "stream-json", "--verbose"],
                 cwd=workspace, base_url=server.url)
    assert result.code == 3 and len(server.bodies) == 3
    assert (workspace / "calls").read_text() == "x\nx\n"  # the third reply's call, past the budget, never ran
    assert json.loads(result.stdout.splitlines()[-1])["subtype"] == "error_max_budget_usd"


@pytest.mark.parametrize("allow, command, expected", [
    ("Bash(echo:*)", "echo $HOME_SECRET", ""),  # unmatched: asked (a session, SDK mode) or run (-p)
    ("Bash(echo:*)", 'echo "${HOME_SECRET}"', ""),
    ("Bash(echo:*)", "echo $(cat ~/.ssh/id_rsa)", ""),
    ("Bash(echo *)", "echo `id`", ""),
    ("Bash(echo:*)", "echo '$HOME_SECRET'", "allow"),  # single quotes: no expansion
    ("Bash(echo:*)", "echo \\$HOME", "allow"),
    ("Bash(echo:*)", "echo plain", "allow"),
    ("Bash(echo $HOME)", "echo $HOME", "allow"),  # an exact rule says what it approves
    ("Bash", "echo $HOME_SECRET", "allow"),
])
def test_a_prefix_rule_does_not_approve_what_an_expansion_hides(allow, command, expected):
    rules = {"deny": [], "ask": [], "allow": [agent.parse_rule(allow, "test", Path("/proj"))]}
    assert agent.decide(rules, "Bash", {"command": command}, Path("/proj"), None)[0] == expected


def test_sdk_mode_asks_about_a_command_with_an_expansion_that_a_prefix_rule_would_allow(serve, workspace):
    server = serve(tool_then([call("Bash", {"command": "echo plain"}, id="p1"),
                              call("Bash", {"command": "echo $HOME_SECRET"}, id="s1")], last_result))
    asked = []

    async def can_use_tool(name, tool_input, context):
        asked.append(tool_input["command"])
        return PermissionResultDeny(message="not that")

    async def run() -> None:
        async with ClaudeSDKClient(options=options(server, workspace, can_use_tool=can_use_tool,
                                                   allowed_tools=["Bash(echo:*)"])) as client:
            await client.query("go")
            [m async for m in client.receive_response()]

    anyio.run(run)
    assert asked == ["echo $HOME_SECRET"] and tool_results(server.bodies[1]) == ["plain\n[exit code 0]", "not that"]


def test_stream_json_says_status_before_each_request_and_each_denial(serve, run, workspace):
    server = serve(tool_then([call("Bash", {"command": "rm -rf x"}, id="r1")], last_result))
    result = run(["-p", "go", "--output-format", "stream-json", "--verbose", "--disallowedTools", "Bash(rm:*)"],
                 cwd=workspace, base_url=server.url)
    events = [json.loads(line) for line in result.stdout.splitlines()]
    system = [e for e in events if e["type"] == "system" and e["subtype"] != "init"]
    status, denied, again = system
    session = events[-1]["session_id"]
    assert status == {"type": "system", "subtype": "status", "status": "requesting", "parent_tool_use_id": None,
                      "session_id": session, "uuid": status["uuid"]} and again["subtype"] == "status"
    assert (denied["subtype"], denied["tool_name"], denied["tool_use_id"]) == ("permission_denied", "Bash", "r1")
    assert denied["message"].startswith("Error: permission denied by Bash(rm:*)")
    assert events.index(denied) < next(i for i, e in enumerate(events) if e["type"] == "user")


@pytest.mark.parametrize("sources, read", [
    ([], set()),
    (["user"], {"MINE"}),
    (["project"], {"PROJECT"}),
    (["local"], {"LOCAL"}),
    (None, {"MINE", "PROJECT", "LOCAL"}),  # the command line's default: all three
])
def test_setting_sources_choose_the_claude_md_files_too(serve, run, workspace, sources, read):
    home = workspace.parent / "home"
    (home / ".claude").mkdir(parents=True, exist_ok=True)
    (home / ".claude" / "CLAUDE.md").write_text("MINE")
    (workspace / "CLAUDE.md").write_text("PROJECT")
    (workspace / "CLAUDE.local.md").write_text("LOCAL")
    server = serve(lambda body: reply("ok"))
    flags = [] if sources is None else [f"--setting-sources={','.join(sources)}"]
    assert run(["-p", "hi", *flags], cwd=workspace, base_url=server.url, env={"HOME": str(home)}).code == 0
    system = server.bodies[0]["messages"][0]["content"]
    assert {word for word in ("MINE", "PROJECT", "LOCAL") if word in system} == read


def reads_outside(outside: Path):
    """A model that reads a file inside the working directory and one outside it, then answers with the results."""
    return tool_then([call("Read", {"file_path": "inside.txt"}, id="r1"),
                      call("Read", {"file_path": str(outside / "secret.txt")}, id="r2"),
                      call("Grep", {"pattern": "s", "path": str(outside)}, id="g1")], lambda body: json.dumps(
                          tool_results(body)))


@pytest.mark.parametrize("add_dir", [False, True])
def test_reading_outside_the_working_directory_asks_can_use_tool(serve, workspace, tmp_path, add_dir):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.txt").write_text("s3cret\n")
    (workspace / "inside.txt").write_text("hello\n")
    server = serve(reads_outside(outside))
    asked = []

    async def can_use_tool(name, tool_input, context):
        asked.append(name)
        return PermissionResultDeny(message="stay inside")

    async def run() -> None:
        opts = options(server, workspace, can_use_tool=can_use_tool, add_dirs=[str(outside)] if add_dir else [])
        async with ClaudeSDKClient(options=opts) as client:
            await client.query("go")
            [m async for m in client.receive_response()]

    anyio.run(run)
    inside, secret, grep = tool_results(server.bodies[1])
    assert "hello" in inside
    if add_dir:  # --add-dir widens the boundary
        assert asked == [] and "s3cret" in secret and "secret.txt" in grep
    else:
        assert asked == ["Read", "Grep"] and (secret, grep) == ("stay inside", "stay inside")


def test_without_a_callback_sdk_mode_denies_reading_outside_and_p_reads_it(serve, run, workspace, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "secret.txt").write_text("s3cret\n")
    (workspace / "inside.txt").write_text("hello\n")
    server = serve(reads_outside(tmp_path / "elsewhere"))
    result = collect("go", options(server, workspace))[-1]
    assert [d["tool_use_id"] for d in result.permission_denials] == ["r2", "g1"] and "hello" in result.result
    result = run(["-p", "go"], cwd=workspace, base_url=server.url)  # -p runs every unmatched call, as documented
    assert "s3cret" in result.stdout and "hello" in result.stdout


def test_accept_edits_still_asks_before_writing_outside(serve, workspace, tmp_path):
    server = serve(tool_then([call("Write", {"file_path": "in.txt", "content": "x"}, id="w1"),
                              call("Write", {"file_path": str(tmp_path / "out.txt"), "content": "x"}, id="w2")],
                             last_result))
    asked = []

    async def can_use_tool(name, tool_input, context):
        asked.append(tool_input["file_path"])
        return PermissionResultDeny(message="no")

    async def run() -> None:
        opts = options(server, workspace, can_use_tool=can_use_tool, permission_mode="acceptEdits")
        async with ClaudeSDKClient(options=opts) as client:
            await client.query("go")
            [m async for m in client.receive_response()]

    anyio.run(run)
    assert (workspace / "in.txt").exists() and not (tmp_path / "out.txt").exists()
    assert asked == [str(tmp_path / "out.txt")]


def test_tool_use_result_is_claude_code_s_object_for_built_in_tools(serve, workspace):
    (workspace / "notes.txt").write_text("one\ntwo\nthree\n")
    (workspace / "old.txt").write_text("a\nb\n")
    server = serve(tool_then([call("Read", {"file_path": "notes.txt", "offset": 2, "limit": 1}, id="r1"),
                              call("Edit", {"file_path": "notes.txt", "old_string": "two", "new_string": "2"}, id="e1"),
                              call("Write", {"file_path": "new.txt", "content": "x\n"}, id="w1"),
                              call("Write", {"file_path": "old.txt", "content": "a\nB\n"}, id="w2"),
                              call("Bash", {"command": "echo out; echo err >&2"}, id="b1")], "done"))
    messages = collect("go", options(server, workspace, permission_mode="bypassPermissions"))
    results = {m.content[0].tool_use_id: m for m in messages if type(m).__name__ == "UserMessage"}
    read = results["r1"].tool_use_result
    assert read == {"type": "text", "file": {"filePath": str(workspace / "notes.txt"), "content": "two\n",
                                             "numLines": 1, "startLine": 2, "totalLines": 3}}
    assert results["r1"].content[0].content.startswith("two\n\n[Showing lines 2-2 of 3.")  # the text is unchanged
    edit = results["e1"].tool_use_result
    assert (edit["filePath"], edit["oldString"], edit["newString"], edit["replaceAll"]) == (
        str(workspace / "notes.txt"), "two", "2", False)
    assert edit["originalFile"] == "one\ntwo\nthree\n" and edit["structuredPatch"] == [
        {"oldStart": 1, "oldLines": 3, "newStart": 1, "newLines": 3, "lines": [" one", "-two", "+2", " three"]}]
    created, updated = results["w1"].tool_use_result, results["w2"].tool_use_result
    assert created == {"type": "create", "filePath": str(workspace / "new.txt"), "content": "x\n",
                       "structuredPatch": [], "originalFile": None}
    assert updated["type"] == "update" and updated["structuredPatch"][0]["lines"] == [" a", "-b", "+B"]
    bash = results["b1"].tool_use_result
    assert bash == {"stdout": "out\nerr", "stderr": "", "interrupted": False}  # solo keeps the two in order, as one


def test_the_sdk_s_session_functions_find_solo_s_sessions(serve, workspace, tmp_path, monkeypatch):
    solo_home = tmp_path / "solo-home"
    server = serve(tool_then([call("Bash", {"command": "echo hi"}, id="c1")], "all done"))
    opts = options(server, workspace, permission_mode="bypassPermissions")
    opts.env["SOLO_HOME"] = str(solo_home)
    result = collect("say hi", opts)[-1]
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(solo_home))
    [info] = list_sessions(directory=str(workspace))
    assert (info.session_id, info.first_prompt, info.cwd) == (result.session_id, "say hi", str(workspace))
    messages = get_session_messages(result.session_id, directory=str(workspace))
    assert [m.type for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[0].message["content"] == "say hi" and messages[-1].message["content"] == [
        {"type": "text", "text": "all done"}]
    assert messages[1].message["content"][0] == {"type": "tool_use", "id": "c1", "name": "Bash",
                                                 "input": {"command": "echo hi"}}
    assert messages[2].message["content"][0]["tool_use_id"] == "c1"


LISTED = [{"id": f"anthropic/claude-{name}"} for name in ("sonnet-4.5", "sonnet-4.6", "haiku-4.5", "haiku-5",
                                                          "opus-4.1")] + [{"id": "openai/gpt-5"}]


def test_aliases_follow_openrouter_s_newest_models_kept_a_day(serve, run, workspace, tmp_path):
    server = serve(lambda body: reply(body["model"]), accept="", models=LISTED)
    env = {"SOLO_HOME": str(tmp_path / "solo-home")}
    assert run(["-p", "hi", "--model", "sonnet"], cwd=workspace, base_url=server.url, env=env).stdout == \
        "anthropic/claude-sonnet-4.6\n"
    assert server.gets == ["/api/v1/models"]  # asked once, because the run named an alias
    assert run(["-p", "hi"], cwd=workspace, base_url=server.url, env=env).stdout == "anthropic/claude-haiku-5\n"
    assert run(["-p", "hi", "--model", "opus"], cwd=workspace, base_url=server.url, env=env).stdout == \
        "anthropic/claude-opus-4.1\n"
    assert run(["-p", "hi", "--model", "openai/gpt-5"], cwd=workspace, base_url=server.url, env=env).stdout == \
        "openai/gpt-5\n"
    assert server.gets == ["/api/v1/models"]  # the list is kept a day


def test_aliases_fall_back_to_today_s_table_without_the_list(serve, run, workspace, tmp_path):
    server = serve(lambda body: reply(body["model"]), accept="")  # GET /models: 404
    env = {"SOLO_HOME": str(tmp_path / "solo-home")}
    assert run(["-p", "hi", "--model", "sonnet"], cwd=workspace, base_url=server.url, env=env).stdout == \
        "anthropic/claude-sonnet-4.5\n"
    assert run(["-p", "hi"], cwd=workspace, base_url=server.url, env=env).stdout == "anthropic/claude-haiku-4.5\n"
    assert server.gets == ["/api/v1/models"]  # only a run naming an alias asks: a default run pays nothing


SDK_FLAGS = ["--output-format", "stream-json", "--verbose", "--input-format", "stream-json"]


def protocol(server, workspace, lines: list[dict], *flags: str) -> list[dict]:
    """What solo writes in SDK mode for these stdin lines (stdin then closed)."""
    env = {**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "sk-test-secret-123"}
    done = subprocess.run([str(PROGRAM), *SDK_FLAGS, *flags], cwd=workspace, env=env, capture_output=True, text=True,
                          input="".join(json.dumps(line) + "\n" for line in lines), timeout=60)
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_initialize_answer_lists_commands_skills_and_agents_and_says_what_it_applied(serve, workspace):
    (workspace / ".claude" / "commands").mkdir(parents=True)
    (workspace / ".claude" / "commands" / "review.md").write_text("---\ndescription: Review it\nargument-hint: "
                                                                  "[file]\n---\nReview $ARGUMENTS\n")
    (workspace / ".claude" / "skills" / "deploy").mkdir(parents=True)
    (workspace / ".claude" / "skills" / "deploy" / "SKILL.md").write_text("---\nname: deploy\ndescription: Ship "
                                                                          "it\n---\nSteps.\n")
    server = serve(lambda body: reply("ok"))
    initialize = {"type": "control_request", "request_id": "req_1", "request": {
        "subtype": "initialize", "hooks": None, "appendSystemPrompt": "Be terse.",
        "agents": {"checker": {"description": "Checks", "prompt": "You check."}}}}
    prompt = {"type": "user", "message": {"role": "user", "content": "/review app.py"}, "parent_tool_use_id": None}
    out = protocol(server, workspace, [initialize, prompt], "--await-initialize")
    answer = out[0]["response"]["response"]
    assert {(c["name"], c["description"], c["argumentHint"]) for c in answer["commands"]} == {
        ("deploy", "Ship it", ""), ("review", "Review it", "[file]")}
    assert answer["agents"] == [{"name": "general-purpose", "description": agent.GENERAL_AGENT.description},
                                {"name": "checker", "description": "Checks"}]
    assert answer["hook_on_failure_supported"] is True and answer["mcp_servers_applied"] is True
    sent = server.bodies[0]["messages"]
    assert sent[0]["content"].endswith("Be terse.") and sent[1]["content"] == "Review app.py"  # the command ran
    assert out[-1]["type"] == "result" and out[-1]["subtype"] == "success"


def test_a_program_that_sends_no_initialize_is_answered_all_the_same(serve, workspace):
    server = serve(lambda body: reply("ok"))
    prompt = {"type": "user", "message": {"role": "user", "content": "hi"}, "parent_tool_use_id": None}
    out = protocol(server, workspace, [prompt])
    assert [line["type"] for line in out] == ["system", "system", "assistant", "result"]
    assert out[-1]["result"] == "ok"


def test_a_session_asks_before_reading_outside_the_working_directory(serve, terminal, workspace, tmp_path):
    (tmp_path / "secret.txt").write_text("s3cret\n")
    server = serve(tool_then([call("Read", {"file_path": str(tmp_path / "secret.txt")})],
                             lambda body: "read: " + last_result(body)))
    term = terminal(server)
    term.send("look\r")
    term.expect(r"Allow Read\? \[y/n")
    term.send("n\r")
    term.expect("read: Error: permission denied")
    assert "s3cret" not in json.dumps(server.bodies[-1]["messages"])


def test_a_sub_agent_s_model_alias_follows_the_kept_model_list(serve, run, workspace, tmp_path):
    (workspace / ".claude" / "agents").mkdir(parents=True)
    (workspace / ".claude" / "agents" / "quick.md").write_text("---\ndescription: quick\nmodel: sonnet\n---\nBe quick.")
    server = serve(lambda body: reply(body["model"]) if body["messages"][0]["content"].startswith("Be quick") else
                   reply("main: " + last_result(body)) if body["messages"][-1]["role"] == "tool" else
                   reply(tool_calls=[call("Agent", {"description": "d", "prompt": "p", "subagent_type": "quick"})]),
                   accept="", models=LISTED)
    result = run(["-p", "go", "--model", "opus"], cwd=workspace, base_url=server.url,
                 env={"SOLO_HOME": str(tmp_path / "solo-home")})
    assert result.stdout == "main: anthropic/claude-sonnet-4.6\n"
