"""solo --acp, the Agent Client Protocol: a real ACP client (the `agent-client-protocol` package) drives
./your_program.sh against the fake OpenRouter; raw JSON-RPC lines for the bad-input cases."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from acp import (PROTOCOL_VERSION, embedded_text_resource, image_block, resource_block, resource_link_block,
                 spawn_agent_process, text_block)
from acp.schema import (AllowedOutcome, ClientCapabilities, DeniedOutcome, FileSystemCapabilities, McpServerStdio,
                        ReadTextFileResponse, RequestPermissionResponse)

from app import main as agent
from tests.conftest import PROGRAM

MCP_SERVER = Path(__file__).resolve().with_name("mcp_server.py")
from tests.fake_openrouter import Raw, Stream, call, last_result, reply, streamed, tool_then
from tests.test_toolbox import png


class Editor:
    """The client side: every update and question kept as the protocol's JSON; questions answered from a script;
    files read from `buffers` (an editor's unsaved text) and written there."""

    def __init__(self, answers=(), buffers=None):
        self.updates, self.questions, self.answers = [], [], list(answers)
        self.buffers, self.written, self.seen, self.asked_in = buffers or {}, {}, [], []

    async def session_update(self, session_id, update, **kwargs):
        entry = update.model_dump(mode="json", by_alias=True, exclude_none=True)
        self.updates.append(entry)
        self.seen.append(("update", entry.get("sessionUpdate"), entry.get("status")))

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        self.asked_in.append(session_id)
        self.questions.append({"toolCall": tool_call.model_dump(mode="json", by_alias=True, exclude_none=True),
                               "options": [o.model_dump(mode="json", by_alias=True) for o in options]})
        self.seen.append(("question", tool_call.tool_call_id, None))
        answer = self.answers.pop(0) if self.answers else "allow_once"
        if answer == "wait":  # never answered: a cancel must end the prompt anyway
            await asyncio.sleep(60)
        outcome = DeniedOutcome(outcome="cancelled") if answer == "cancelled" else \
            AllowedOutcome(outcome="selected", option_id=answer)
        return RequestPermissionResponse(outcome=outcome)

    async def read_text_file(self, session_id, path, line=None, limit=None, **kwargs):
        return ReadTextFileResponse(content=self.buffers[path])

    async def write_text_file(self, session_id, path, content, **kwargs):
        self.written[path] = content

    def kinds(self, kind):
        """The updates of one kind."""
        return [u for u in self.updates if u["sessionUpdate"] == kind]

    def on_connect(self, conn):
        pass


def solo_env(server, workspace, **extra):
    """The environment an editor starts solo with: the fake server, a key, an empty home."""
    home = workspace.parent / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENROUTER_", "SOLO_"))}
    return {**env, "OPENROUTER_BASE_URL": server.url if server else "", "OPENROUTER_API_KEY": "sk-test-secret-123",
            "HOME": str(home), **extra}


def drive(server, workspace, script, *, editor=None, args=(), fs=False, env=None):
    """Run `script(conn, editor, process)` against `solo --acp` after the handshake; its result."""
    editor = editor or Editor()

    async def main():
        async with spawn_agent_process(editor, str(PROGRAM), "--acp", *args, cwd=str(workspace),
                                       env=env or solo_env(server, workspace)) as (conn, process):
            caps = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=fs, write_text_file=fs))
            hello = await conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=caps)
            assert hello.protocol_version == 1
            return await asyncio.wait_for(script(conn, editor, process), 60)
    return asyncio.run(main())


def prompt(conn, session_id, text):
    """A text prompt."""
    return conn.prompt(session_id=session_id, prompt=[text_block(text)])


def test_initialize_says_what_solo_takes_and_answers_version_1_to_a_later_one(workspace):
    proc = raw(workspace, [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
                            "params": {"protocolVersion": 7, "clientCapabilities": {}}}])
    answer = proc[0]["result"]
    assert answer["protocolVersion"] == 1 and answer["agentInfo"]["name"] == "solo"
    assert answer["agentCapabilities"] == {"loadSession": True, "promptCapabilities": {
        "image": True, "audio": False, "embeddedContext": True}, "mcpCapabilities": {"http": True, "sse": False}}
    assert answer["authMethods"][0]["id"] == "openrouter-api-key"


def test_a_turn_streams_text_and_a_tool_call_asked_about_first(serve, workspace, run):
    server = serve(lambda body: streamed(reply(tool_calls=[call("Bash", {"command": "echo hi"}, id="c1")]))
                   if body["messages"][-1]["role"] == "user" else streamed(reply("all done here")))

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        assert session.modes.current_mode_id == "default"
        return session.session_id, await prompt(conn, session.session_id, "say hi")
    editor = Editor()
    sid, answer = drive(server, workspace, script, editor=editor)
    assert answer.stop_reason == "end_turn"
    start = editor.kinds("tool_call")[0]
    assert start == {"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "Bash(echo hi)", "kind": "execute",
                     "status": "pending", "locations": [], "rawInput": {"command": "echo hi"}}
    assert [s for s in editor.seen if s[0] == "question" or s[1] == "tool_call_update"] == [
        ("question", "c1", None), ("update", "tool_call_update", "in_progress"),
        ("update", "tool_call_update", "completed")]
    question = editor.questions[0]
    assert [o["kind"] for o in question["options"]] == ["allow_once", "allow_always", "reject_once", "reject_always"]
    assert question["toolCall"]["rawInput"] == {"command": "echo hi"}
    done = editor.kinds("tool_call_update")[-1]
    assert done["content"][0]["content"]["text"] == "hi\n[exit code 0]" == done["rawOutput"]
    assert "".join(u["content"]["text"] for u in editor.kinds("agent_message_chunk")) == "all done here"
    again = run(["-r", sid, "-p", "and now?"], cwd=workspace, base_url=server.url)  # the editor's thread at a terminal
    assert again.code == 0 and any("say hi" in json.dumps(m) for m in server.bodies[-1]["messages"])


def test_edits_go_through_the_editors_buffers_with_a_diff(serve, workspace):
    (workspace / "notes.txt").write_text("on disk\n")
    target = str(workspace / "notes.txt")
    server = serve(lambda body: reply(tool_calls=[call("Read", {"file_path": "notes.txt"}, id="r1")])
                   if len(body["messages"]) == 2 else
                   reply(tool_calls=[call("Edit", {"file_path": "notes.txt", "old_string": "unsaved",
                                                   "new_string": "saved"}, id="e1")])
                   if len(body["messages"]) == 4 else reply(last_result(body)))
    editor = Editor(buffers={target: "unsaved text\n"})

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        return await prompt(conn, session.session_id, "fix it")
    assert drive(server, workspace, script, editor=editor, fs=True).stop_reason == "end_turn"
    assert "unsaved text" in server.bodies[1]["messages"][-1]["content"]  # the buffer, not the disk
    assert editor.written == {target: "saved text\n"} and (workspace / "notes.txt").read_text() == "on disk\n"
    edit = editor.kinds("tool_call_update")[-1]
    assert edit["status"] == "completed" and edit["content"][1] == {
        "type": "diff", "path": target, "oldText": "unsaved text\n", "newText": "saved text\n"}
    assert editor.kinds("tool_call")[0]["locations"] == [{"path": target}]
    assert editor.questions[0]["toolCall"]["content"][0]["type"] == "diff"


def test_a_file_the_editor_cannot_read_is_read_from_the_disk(serve, workspace):
    (workspace / "plain.txt").write_text("from the disk\n")
    server = serve(tool_then([call("Read", {"file_path": "plain.txt"}, id="r1")], last_result))

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        return await prompt(conn, session.session_id, "read")
    assert drive(server, workspace, script, fs=True).stop_reason == "end_turn"  # its buffers hold no such file
    assert "from the disk" in server.bodies[-1]["messages"][-1]["content"]


def test_each_permission_answer_does_what_it_says(serve, workspace):
    commands = ["touch once", "touch never", "mkdir always", "mkdir also", "touch never"]

    def model(body):
        done = sum(m["role"] == "tool" for m in body["messages"])
        return reply("done") if done == len(commands) else \
            reply(tool_calls=[call("Bash", {"command": commands[done]}, id=f"c{done + 1}")])
    server = serve(model)
    editor = Editor(answers=["allow_once", "reject_once", "allow_always", "reject_once"])

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        return await prompt(conn, session.session_id, "go")
    assert drive(server, workspace, script, editor=editor).stop_reason == "end_turn"
    assert (workspace / "once").exists() and (workspace / "always").exists() and not (workspace / "never").exists()
    assert [q["toolCall"]["toolCallId"] for q in editor.questions] == ["c1", "c2", "c3", "c5"]  # c4: allowed always
    assert editor.questions[2]["options"][1]["name"].startswith("Always allow Bash(mkdir")
    assert (workspace / "also").is_dir()


def test_reject_always_adds_a_deny_rule_for_the_session(serve, workspace):
    server = serve(lambda body: reply(tool_calls=[call("Bash", {"command": "touch x"}, id=f"c{len(body['messages'])}")])
                   if len(body["messages"]) < 6 else reply("ok"))
    editor = Editor(answers=["reject_always"])

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        return await prompt(conn, session.session_id, "go")
    assert drive(server, workspace, script, editor=editor).stop_reason == "end_turn"
    assert len(editor.questions) == 1 and not (workspace / "x").exists()
    assert "this session" in server.bodies[-1]["messages"][-1]["content"]


def test_cancel_kills_the_command_answers_cancelled_and_the_session_goes_on(serve, workspace):
    marker = f"acp-cancel-{os.getpid()}-{time.monotonic_ns()}"
    server = serve(lambda body: reply("after") if "again" in json.dumps(body["messages"][-1]) else
                   reply(tool_calls=[call("Bash", {"command": f"sleep 30 # {marker}"}, id="c1")]))

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        turn = asyncio.ensure_future(prompt(conn, session.session_id, "wait"))
        while ("update", "tool_call_update", "in_progress") not in editor.seen:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        asked = time.monotonic()
        await conn.cancel(session_id=session.session_id)
        cancelled = await turn
        took = time.monotonic() - asked
        return cancelled, took, await prompt(conn, session.session_id, "again")
    cancelled, took, after = drive(server, workspace, script, args=("--yes",))
    assert cancelled.stop_reason == "cancelled" and took < 2 and after.stop_reason == "end_turn"
    assert marker not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "wait" not in json.dumps(server.bodies[-1]["messages"])  # the cancelled turn was dropped


def test_cancel_mid_stream_and_mid_question(serve, workspace):
    held = threading.Event()
    server = serve(lambda body: Stream([{"choices": [{"index": 0, "delta": {"content": "partial "}}]},
                                        lambda: held.wait(30)]) if "stream" in json.dumps(body["messages"][-1])
                   else reply(tool_calls=[call("Write", {"file_path": "f", "content": "x"}, id="w1")]))
    editor = Editor(answers=["wait"])

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        results = []
        for text, ready in (("stream", "agent_message_chunk"), ("question", None)):
            turn = asyncio.ensure_future(prompt(conn, session.session_id, text))
            while not (editor.kinds(ready) if ready else editor.questions):
                await asyncio.sleep(0.02)
            asked = time.monotonic()
            await conn.cancel(session_id=session.session_id)
            results.append(((await turn).stop_reason, time.monotonic() - asked))
        return results
    try:
        results = drive(server, workspace, script, editor=editor)
    finally:
        held.set()
    assert [r[0] for r in results] == ["cancelled", "cancelled"] and all(r[1] < 2 for r in results)
    assert not (workspace / "f").exists()


def test_plan_modes_models_and_commands(serve, workspace):
    (workspace / ".claude" / "commands").mkdir(parents=True)
    (workspace / ".claude" / "commands" / "greet.md").write_text("---\ndescription: Say hello\n---\nGreet $ARGUMENTS")
    (workspace / ".claude" / "skills" / "tidy").mkdir(parents=True)
    (workspace / ".claude" / "skills" / "tidy" / "SKILL.md").write_text(
        "---\nname: tidy\ndescription: Tidy the code\n---\nTidy it.")
    todos = [{"content": "look", "status": "in_progress", "activeForm": "Looking"}]
    server = serve(tool_then([call("TodoWrite", {"todos": todos}, id="t1")], "planned"), accept="anthropic/claude-")

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        await conn.set_session_mode(session_id=session.session_id, mode_id="acceptEdits")
        options = await conn.set_config_option(session_id=session.session_id, config_id="model", value="sonnet")
        answer = await prompt(conn, session.session_id, "/greet the world")
        return session, options, answer
    editor = Editor()
    session, options, answer = drive(server, workspace, script, editor=editor)
    assert [m.id for m in session.modes.available_modes] == ["default", "acceptEdits", "plan", "bypassPermissions"]
    assert answer.stop_reason == "end_turn"
    commands = editor.kinds("available_commands_update")[0]["availableCommands"]
    assert {"name": "greet", "description": "Say hello", "input": {"hint": "arguments"}} in commands
    assert {"name": "tidy", "description": "Tidy the code", "input": {"hint": "arguments"}} in commands
    assert editor.kinds("current_mode_update") == [{"sessionUpdate": "current_mode_update",
                                                    "currentModeId": "acceptEdits"}]
    model = next(o for o in options.config_options if o.id == "model")
    told = editor.kinds("config_option_update")[-1]["configOptions"]
    assert [o["currentValue"] for o in told] == ["acceptEdits", "anthropic/claude-sonnet-4.5"]
    assert model.current_value == "anthropic/claude-sonnet-4.5" == server.bodies[0]["model"]
    assert "Greet the world" in json.dumps(server.bodies[0]["messages"][-1])
    assert editor.kinds("plan") == [{"sessionUpdate": "plan", "entries": [
        {"content": "look", "priority": "medium", "status": "in_progress"}]}]
    assert editor.kinds("tool_call")[0]["kind"] == "think"


def test_a_saved_session_loads_as_updates_and_goes_on(serve, workspace):
    server = serve(tool_then([call("Bash", {"command": "echo saved"}, id="c1")], "remembered"))

    async def first(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        await prompt(conn, session.session_id, "remember this")
        return session.session_id
    sid = drive(server, workspace, first, args=("--yes",))
    editor = Editor()

    async def second(conn, editor, process):
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        return await prompt(conn, sid, "and then?")
    assert drive(server, workspace, second, editor=editor, args=("--yes",)).stop_reason == "end_turn"
    kinds = [u["sessionUpdate"] for u in editor.updates]
    assert kinds[:4] == ["user_message_chunk", "tool_call", "tool_call_update", "agent_message_chunk"]
    assert editor.updates[0]["content"]["text"] == "remember this"
    assert editor.updates[2]["content"][0]["content"]["text"] == "saved\n[exit code 0]"
    assert "remember this" in json.dumps(server.bodies[-1]["messages"])


def test_two_sessions_run_at_once_and_a_busy_one_says_so(serve, workspace):
    both, release = threading.Barrier(2, timeout=20), threading.Event()

    def model(body):
        both.wait()  # both prompts reached the model before either is answered
        release.wait(20)
        return reply("answered")
    server = serve(model)

    async def script(conn, editor, process):
        one = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        two = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        first = asyncio.ensure_future(prompt(conn, one.session_id, "busy 1"))
        second = asyncio.ensure_future(prompt(conn, two.session_id, "busy 2"))
        await asyncio.sleep(0.3)
        with pytest.raises(Exception) as refused:
            await prompt(conn, one.session_id, "more")
        release.set()
        return one, two, await first, await second, refused.value
    one, two, first, second, refused = drive(server, workspace, script)
    assert one.session_id != two.session_id and first.stop_reason == second.stop_reason == "end_turn"
    assert "still answering" in str(refused)


def test_project_trust_is_asked_through_the_editor(serve, workspace):
    (workspace / ".mcp.json").write_text(json.dumps({"mcpServers": {"calc": {"command": "false"}}}))
    server = serve(lambda body: reply("ok"))
    editor = Editor(answers=["reject_always"])

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        return session, await prompt(conn, session.session_id, "hi")
    session, answer = drive(server, workspace, script, editor=editor)
    assert answer.stop_reason == "end_turn" and editor.asked_in == [session.session_id]  # once it knows the session
    assert "calc" in editor.questions[0]["toolCall"]["content"][0]["content"]["text"]
    assert [o["kind"] for o in editor.questions[0]["options"]] == ["allow_always", "reject_always"]


@pytest.mark.parametrize("args, answer, stop", [
    (("--max-turns", "1"), reply(tool_calls=[call("Read", {"file_path": "a.txt"})]), "max_turn_requests"),
    ((), reply("cut", finish_reason="length"), "max_tokens"),
    ((), reply("", finish_reason="content_filter"), "refusal"),
])
def test_stop_reasons(serve, workspace, args, answer, stop):
    (workspace / "a.txt").write_text("a\n")
    server = serve(lambda body: answer)

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        return await prompt(conn, session.session_id, "go")
    assert drive(server, workspace, script, args=args).stop_reason == stop


def test_a_sub_agents_calls_come_under_its_agent_call(serve, workspace):
    (workspace / "a.txt").write_text("inside\n")

    def model(body):
        messages, last = body["messages"], body["messages"][-1]
        if any(m["role"] == "user" and m["content"] == "look around" for m in messages):  # the sub-agent's
            return reply(tool_calls=[call("Read", {"file_path": "a.txt"}, id="s1")]) if last["role"] == "user" \
                else reply("found it")
        return reply(tool_calls=[call("Agent", {"description": "look", "prompt": "look around",
                                                "subagent_type": "general-purpose"}, id="a1")]) \
            if last["role"] == "user" else reply("done")
    server = serve(model)

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        return await prompt(conn, session.session_id, "delegate")
    editor = Editor()
    assert drive(server, workspace, script, editor=editor, args=("--yes",)).stop_reason == "end_turn"
    calls = {u["toolCallId"]: u for u in editor.kinds("tool_call")}
    assert calls["a1"]["kind"] == "think" and "_meta" not in calls["a1"]
    assert calls["s1"]["_meta"] == {"parentToolCallId": "a1"} and calls["s1"]["kind"] == "read"
    ends = [(u["toolCallId"], u["status"]) for u in editor.kinds("tool_call_update") if u["status"] != "in_progress"]
    assert ends == [("s1", "completed"), ("a1", "completed")]


PIXEL = base64.b64encode(png(1, 1)).decode()  # a real PNG: every image is checked before it is sent


def test_prompt_blocks_become_text_mentions_context_and_images(serve, workspace):
    (workspace / "linked.py").write_text("print('linked')\n")
    server = serve(lambda body: reply("seen"))

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        return await conn.prompt(session_id=session.session_id, prompt=[
            text_block("look at"), resource_link_block(name="linked.py", uri=f"file://{workspace}/linked.py"),
            resource_block(embedded_text_resource("file:///elsewhere/notes.md", "an embedded note")),
            image_block(PIXEL, "image/png")])
    assert drive(server, workspace, script).stop_reason == "end_turn"
    sent = server.bodies[0]["messages"][-1]["content"]
    text = sent[0]["text"]
    assert "look at" in text and "print('linked')" in text and "an embedded note" in text
    assert sent[1] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}}


def test_a_failed_turn_is_an_error_and_the_session_goes_on(serve, workspace):
    answers = iter([Raw(400, {"error": {"message": "bad thing", "code": 400}}), reply("fine")])
    server = serve(lambda body: next(answers))

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        with pytest.raises(Exception) as failed:
            await prompt(conn, session.session_id, "first")
        return failed.value, await prompt(conn, session.session_id, "second")
    failed, after = drive(server, workspace, script)
    assert "bad thing" in str(failed) and after.stop_reason == "end_turn"
    assert "first" not in json.dumps(server.bodies[-1]["messages"])


class Lines:
    """solo --acp spoken to line by line: requests written, answers read (updates in between kept)."""

    def __init__(self, server, workspace, *args):
        self.proc = subprocess.Popen([str(PROGRAM), "--acp", *args], cwd=workspace, env=solo_env(server, workspace),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        self.ids, self.seen = 0, []

    def send(self, method, params):
        """A request; its id."""
        self.ids += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}) + "\n")
        self.proc.stdin.flush()
        return self.ids

    def until(self, wanted):
        """Read lines up to the first that `wanted` accepts."""
        while line := self.proc.stdout.readline():
            self.seen.append(message := json.loads(line))
            if wanted(message):
                return message
        raise AssertionError("solo ended first")

    def call(self, method, **params):
        """A request and its answer."""
        rid = self.send(method, params)
        return self.until(lambda m: m.get("id") == rid and "method" not in m)


def test_end_of_stdin_ends_every_session_and_what_it_started(serve, workspace):
    marker = f"acp-eof-{os.getpid()}-{time.monotonic_ns()}"
    server = serve(lambda body: reply(tool_calls=[call("Bash", {"command": f"sleep 30 # {marker}"}, id="c1")]))
    solo = Lines(server, workspace, "--yes")
    solo.call("initialize", protocolVersion=1)
    sid = solo.call("session/new", cwd=str(workspace), mcpServers=[])["result"]["sessionId"]
    solo.send("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "wait"}]})
    solo.until(lambda m: m.get("params", {}).get("update", {}).get("status") == "in_progress")
    solo.proc.stdin.close()
    assert solo.proc.wait(10) == 0
    assert marker not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_a_cancel_request_for_a_prompt_cancels_it(serve, workspace):
    held = threading.Event()
    server = serve(lambda body: Stream([{"choices": [{"index": 0, "delta": {"content": "partial "}}]},
                                        lambda: held.wait(30)]))
    solo = Lines(server, workspace)
    solo.call("initialize", protocolVersion=1)
    sid = solo.call("session/new", cwd=str(workspace), mcpServers=[])["result"]["sessionId"]
    rid = solo.send("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]})
    solo.until(lambda m: m.get("params", {}).get("update", {}).get("sessionUpdate") == "agent_message_chunk")
    solo.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": rid}})
                          + "\n")
    solo.proc.stdin.flush()
    try:
        assert solo.until(lambda m: m.get("id") == rid)["result"] == {"stopReason": "cancelled"}
    finally:
        held.set()
    solo.proc.stdin.close()
    assert solo.proc.wait(10) == 0


def test_bad_params_on_a_session_name_the_field(serve, workspace):
    server = serve(lambda body: reply("ok"), accept="anthropic/claude-")
    solo = Lines(server, workspace)
    solo.call("initialize", protocolVersion=1)
    sid = solo.call("session/new", cwd=str(workspace), mcpServers=[])["result"]["sessionId"]
    assert solo.call("session/set_model", sessionId=sid, modelId="opus")["result"] == {}
    options = solo.call("session/set_config_option", sessionId=sid, configId="mode", value="plan")["result"]
    assert [o["currentValue"] for o in options["configOptions"]] == ["plan", "anthropic/claude-opus-4.5"]
    errors = [solo.call(method, **params)["error"] for method, params in [
        ("session/set_mode", {"sessionId": sid, "modeId": "loud"}),
        ("session/set_mode", {"sessionId": sid}),
        ("session/set_config_option", {"sessionId": sid, "configId": "colour", "value": "red"}),
        ("session/prompt", {"sessionId": sid, "prompt": [{"type": "audio", "data": "", "mimeType": "audio/wav"}]}),
        ("session/prompt", {"sessionId": sid, "prompt": "text"}),
        ("session/new", {"cwd": str(workspace), "mcpServers": [{"url": "x"}]}),
        ("session/load", {"sessionId": "0000", "cwd": str(workspace), "mcpServers": []}),
        ("session/cancel", {"sessionId": "nope"})]]
    assert [e["code"] for e in errors] == [-32602] * 6 + [-32002] * 2
    for error, field in zip(errors, ["modeId", "modeId", "colour", "prompt[0]", "prompt", "mcpServers[0]", "0000",
                                     "nope"]):
        assert field in error["message"]
    assert solo.call("session/prompt", sessionId=sid, prompt=[{"type": "text", "text": "hi"}])["result"] == {
        "stopReason": "end_turn"}
    assert server.bodies[-1]["model"] == "anthropic/claude-opus-4.5"
    solo.proc.stdin.close()
    assert solo.proc.wait(10) == 0


def test_the_clients_mcp_servers_start_as_the_users_own(serve, workspace):
    server = serve(tool_then([call("mcp__calc__peek", {"text": "hi"}, id="m1")], last_result))
    stdio = McpServerStdio(name="calc", command=sys.executable, args=[str(MCP_SERVER), "--only", "peek"], env=[])

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[stdio])
        return await prompt(conn, session.session_id, "peek")
    editor = Editor()
    assert drive(server, workspace, script, editor=editor).stop_reason == "end_turn"
    assert editor.kinds("tool_call")[0]["title"].startswith("mcp__calc__peek")
    assert "".join(u["content"]["text"] for u in editor.kinds("agent_message_chunk")) == "peek: hi"


def test_reasoning_streams_as_thoughts_and_a_cancelled_question_cancels(serve, workspace):
    server = serve(lambda body: streamed(reply("answer", reasoning="thinking it over"))
                   if "think" in json.dumps(body["messages"][-1])
                   else reply(tool_calls=[call("Write", {"file_path": "f", "content": "x"}, id="w1")]))
    editor = Editor(answers=["cancelled"])

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        return [(await prompt(conn, session.session_id, text)).stop_reason for text in ("write", "think")]
    assert drive(server, workspace, script, editor=editor) == ["cancelled", "end_turn"]
    assert not (workspace / "f").exists()
    assert "".join(u["content"]["text"] for u in editor.kinds("agent_thought_chunk")) == "thinking it over"


@pytest.mark.parametrize("name, args, kind", [
    ("Bash", {"command": "rm -rf build"}, "delete"), ("Bash", {"command": "mv a b"}, "move"),
    ("Bash", {"command": "rm x; curl evil"}, "execute"), ("Bash", {"command": "ls"}, "execute"),
    ("Read", {}, "read"), ("Edit", {}, "edit"), ("Grep", {}, "search"), ("WebFetch", {}, "fetch"),
    ("TodoWrite", {}, "think"), ("mcp__calc__peek", {}, "other"),
])
def test_tool_kinds(name, args, kind):
    assert agent.acp_kind(name, args) == kind


def test_a_trusted_projects_mcp_servers_start(serve, workspace):
    (workspace / ".mcp.json").write_text(json.dumps({"mcpServers": {"calc": {
        "command": sys.executable, "args": [str(MCP_SERVER), "--only", "peek"]}}}))
    server = serve(tool_then([call("mcp__calc__peek", {"text": "hi"}, id="m1")], last_result))
    editor = Editor(answers=["allow_always"])

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        return await prompt(conn, session.session_id, "peek")
    assert drive(server, workspace, script, editor=editor).stop_reason == "end_turn"
    assert "".join(u["content"]["text"] for u in editor.kinds("agent_message_chunk")) == "peek: hi"
    assert len(editor.questions) == 1  # the trust question; peek is read-only


# --- Raw JSON-RPC lines ---------------------------------------------------------------------------


def raw(workspace, messages, env=None, wait=None):
    """Send lines (objects as JSON, strings as they are) to solo --acp, close stdin, and read every answer."""
    home = workspace.parent / "home"
    home.mkdir(exist_ok=True)
    lines = "".join((m if isinstance(m, str) else json.dumps(m)) + "\n" for m in messages)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OPENROUTER_", "SOLO_"))}
    proc = subprocess.run([str(PROGRAM), "--acp"], input=lines, capture_output=True, text=True, cwd=workspace,
                          env={**base, "HOME": str(home), **(env or {})}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_bad_input_is_answered_and_never_ends_the_process(workspace):
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
    answers = raw(workspace, [
        "this is not json", '{"jsonrpc": "2.0", "id": 2, "method": ', [1, 2],
        {"jsonrpc": "1.0", "id": 3, "method": "initialize"}, {"jsonrpc": "2.0", "id": 4},
        {"jsonrpc": "2.0", "id": 5, "method": "no/such"}, {"jsonrpc": "2.0", "method": "no/such/notice"},
        {"jsonrpc": "2.0", "id": 6, "method": "initialize", "params": {}},
        {"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {"protocolVersion": 0}},
        {"jsonrpc": "2.0", "id": 8, "method": "session/new", "params": {"cwd": "relative", "mcpServers": []}},
        {"jsonrpc": "2.0", "id": 9, "method": "session/prompt", "params": {"sessionId": "nope", "prompt": []}},
        {"jsonrpc": "2.0", "id": 10, "method": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}},
        {"jsonrpc": "2.0", "id": 11, "method": "session/prompt", "params": []}, "[" * 100_000, hello],
        env={"OPENROUTER_API_KEY": ""})
    codes = {a.get("id"): a.get("error", {}).get("code") for a in answers}
    assert [a["error"]["code"] for a in answers if a["id"] is None] == [-32700, -32700, -32600, -32700]
    assert (codes[3], codes[4], codes[5], codes[6], codes[7]) == (-32600, -32600, -32601, -32602, -32602)
    assert "protocolVersion" in next(a for a in answers if a["id"] == 6)["error"]["message"]
    assert "cwd" in next(a for a in answers if a["id"] == 8)["error"]["message"] and codes[8] == -32602
    assert codes[9] == -32002 and "nope" in next(a for a in answers if a["id"] == 9)["error"]["message"]
    assert codes[10] == -32000 and codes[11] == -32602  # no key: the protocol's auth-required error
    assert next(a for a in answers if a["id"] == 1)["result"]["protocolVersion"] == 1  # still serving


def test_sigterm_ends_every_session_and_what_it_started(serve, workspace):
    marker = f"acp-term-{os.getpid()}-{time.monotonic_ns()}"
    server = serve(lambda body: reply(tool_calls=[call("Bash", {"command": f"sleep 30 # {marker}"}, id="c1")]))

    async def script(conn, editor, process):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        asyncio.ensure_future(prompt(conn, session.session_id, "wait"))
        while ("update", "tool_call_update", "in_progress") not in editor.seen:
            await asyncio.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(process.wait(), 10)
    assert drive(server, workspace, script, args=("--yes",)) == 143
    assert marker not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert len(list((workspace.parent / "home" / ".solo" / "projects").glob("*/*.jsonl"))) == 1


def test_a_cancel_reaches_the_prompts_thread_even_as_it_starts_a_thread(monkeypatch):
    # CPython 3.11 gives a thread being started its starter's id until it first runs: a cancel's exception raised
    # then went to the new thread, which died unstarted and left the prompt waiting for ever (SIGTERM then hung)
    class Cancel(BaseException):
        pass
    lost, stop = [], threading.Event()
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: lost.append(unraisable.exc_value))
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # a Cancel that lands outside the loop's try

    def starter():
        while not stop.is_set():
            try:
                newborn = threading.Thread(target=lambda: None)
                newborn.start()
                newborn.join()
            except Cancel:
                pass
    others = [threading.Thread(target=starter, daemon=True) for _ in range(3)]  # some thread is nearly always in limbo
    thread = threading.Thread(target=starter, daemon=True)
    for one in [thread, *others]:
        one.start()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not lost:
        agent.async_raise(thread.ident, Cancel)
        time.sleep(0.0005)
    stop.set()
    for one in [thread, *others]:
        one.join(5)
    assert not lost and not any(one.is_alive() for one in [thread, *others])


def test_a_stop_signal_is_handled_while_another_thread_forks():
    # the kernel gives a signal that comes as a thread forks to that thread (the fork restarts after it), and Python
    # runs handlers on the main thread only: a main thread asleep in a plain queue wait never saw SIGTERM
    class Stop(Exception):
        pass

    def stop(signum, frame):
        raise Stop
    link, done = agent.LineLink(None, lambda message: None, lambda text: None), threading.Event()  # nothing queued

    def fork():
        while not done.is_set():
            subprocess.Popen(["true"], preexec_fn=lambda: None).wait()  # preexec_fn: a fork of this whole process
    sender = subprocess.Popen([sys.executable, "-c", "import os, sys, time\nfor line in sys.stdin:\n"
                               f"    time.sleep(0.002)\n    os.kill({os.getpid()}, {int(signal.SIGUSR2)})"],
                              stdin=subprocess.PIPE, text=True)
    previous, late = signal.signal(signal.SIGUSR2, stop), []
    for _ in range(2):
        threading.Thread(target=fork, daemon=True).start()
    try:
        for _ in range(300):
            lost = threading.Timer(3, link.prompts.put, ("the signal was lost",))  # fails the test, never hangs it
            lost.start()
            sent = time.monotonic()
            try:
                sender.stdin.write("go\n")
                sender.stdin.flush()
                link.next()
            except Stop:
                late += [time.monotonic() - sent] if time.monotonic() - sent > 2 else []
            finally:
                lost.cancel()
    finally:
        done.set()
        signal.signal(signal.SIGUSR2, previous)
        sender.stdin.close()
        sender.wait()
    assert not late, f"stop signals handled only after {late} s"
