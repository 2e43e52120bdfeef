"""MCP servers (issue 15), end to end: ./your_program.sh with servers from .mcp.json or --mcp-config (the test
server tests/mcp_server.py, and the published mcp-server-time) against the fake OpenRouter; read-only calls
of one reply run at once."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from app import main as agent
from tests.conftest import PROGRAM, PROMPT, program_env
from tests.fake_openrouter import call, last_result, reply, tool_results, tool_then

SERVER = Path(__file__).resolve().with_name("mcp_server.py")
TIME_SERVER = Path(sys.executable).parent / "mcp-server-time"  # installed by the test extra into .venv/bin
BUILTINS = {"Read", "Write", "Edit", "Bash", "Glob", "Grep", "BashOutput", "KillShell", "NotebookEdit", "WebFetch", "WebSearch", "TodoWrite", "Agent"}
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def stdio(*args: str, **settings) -> dict:
    """A .mcp.json entry that starts the test server with these options."""
    return {"command": sys.executable, "args": [str(SERVER), *args], **settings}


def mcp_config(**servers: dict) -> str:
    return json.dumps({"mcpServers": servers})


def approve_project(workspace: Path, **settings) -> None:
    """Approve the workspace's .mcp.json servers as a user does for -p: Claude Code's keys in their own
    ~/.claude/settings.json (run() and program_env() give the program the home beside the workspace)."""
    (workspace.parent / "home" / ".claude").mkdir(parents=True, exist_ok=True)
    keys = settings or {"enableAllProjectMcpServers": True}
    (workspace.parent / "home" / ".claude" / "settings.json").write_text(json.dumps(keys))


def tool_names(body: dict) -> set[str]:
    return {tool["function"]["name"] for tool in body.get("tools") or []}


def calls_then_results(calls: list) -> Callable[[dict], dict]:
    """A model that makes these calls in one reply, then answers with the results as a JSON list."""
    return tool_then(calls, lambda body: json.dumps(tool_results(body)))


def records(path: Path) -> list[dict]:
    """What the test server wrote in its record file."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def methods(path: Path) -> list[str]:
    return [r["message"].get("method") for r in records(path) if r["event"] == "message"]


def start(args: list[str], cwd: Path, base_url: str, env: dict | None = None) -> subprocess.Popen:
    """The program started in the background, as run() would run it."""
    return subprocess.Popen([str(PROGRAM), *args], cwd=cwd, env=program_env(cwd, base_url, env),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    """Poll until the condition holds (a deadline, not a race: the condition is what the test waits for)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.02)


def ours(pid: int) -> bool:
    """The pid is still one of the test server's processes (mcp_server.py or its `sleep 600`), not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return state != "Z" and (b"mcp_server.py" in cmdline or cmdline == b"sleep\x00600\x00")


@pytest.fixture
def pidfile(workspace):
    """Paths for the test server's pid files; whatever they name that is still running is killed afterwards."""
    paths: list[Path] = []

    def make(name: str = "pids") -> Path:
        paths.append(workspace.parent / name)
        return paths[-1]

    yield make
    for path in paths:
        for pid in (map(int, path.read_text().split()) if path.exists() else []):
            if ours(pid):
                os.kill(pid, signal.SIGKILL)


def server_pids(path: Path) -> list[int]:
    wait_for(path.exists, f"the server writing {path.name}")
    return [int(pid) for pid in path.read_text().split()]


def all_gone(pids: list[int], timeout: float = 5) -> bool:
    """True once none of the pids is a live process of the test server (killed processes take a moment)."""
    deadline = time.monotonic() + timeout
    while any(ours(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# --- 1. Configuration -----------------------------------------------------------------------------


def test_the_workspace_mcp_json_is_used(serve, run, workspace):
    (workspace / ".mcp.json").write_text(mcp_config(proj=stdio("--only", "echo")))
    approve_project(workspace)
    server = serve(calls_then_results([call("mcp__proj__echo", {"text": "from .mcp.json"})]))
    result = run(["-p", "go"], cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout) == ["echo: from .mcp.json"]
    assert tool_names(server.bodies[0]) == BUILTINS | {"mcp__proj__echo"}


def test_mcp_config_takes_files_and_inline_json_and_adds_to_mcp_json(serve, run, workspace):
    (workspace / ".mcp.json").write_text(mcp_config(proj=stdio("--only", "echo")))
    approve_project(workspace)
    config_file = workspace.parent / "servers.json"
    config_file.write_text(mcp_config(fromfile=stdio("--only", "echo")))
    server = serve(lambda body: reply("ok"))
    result = run(["-p", "go", "--mcp-config", str(config_file), "--mcp-config", mcp_config(inline=stdio("--only", "peek"))],
                 cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    assert tool_names(server.bodies[0]) - BUILTINS == {"mcp__proj__echo", "mcp__fromfile__echo", "mcp__inline__peek"}


def test_strict_mcp_config_ignores_mcp_json_and_never_starts_its_servers(serve, run, workspace, pidfile):
    unused = pidfile("unused")
    (workspace / ".mcp.json").write_text(mcp_config(proj=stdio("--only", "echo", "--pidfile", str(unused))))
    approve_project(workspace)  # approved, and still not started
    server = serve(lambda body: reply("ok"))
    result = run(["-p", "go", "--strict-mcp-config", "--mcp-config", mcp_config(cli=stdio("--only", "echo"))],
                 cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    assert tool_names(server.bodies[0]) - BUILTINS == {"mcp__cli__echo"}
    assert not unused.exists()


@pytest.mark.parametrize("mine", [True, False], ids=["--mcp-config", "the project's .mcp.json"])
def test_variables_are_filled_in_and_the_server_sees_no_secrets(serve, run, workspace, mine):
    """The user's own config may pass a secret on purpose; a project's is filled only from what commands may see
    (issue 29): the secret is left out with one line naming it, never its value."""
    record = workspace.parent / "record"
    spec = {"command": "${PYTHON_FOR_MCP}",
            "args": ["${SERVER_SCRIPT}", "--only", "${TOOLS:-echo}", "--record", "${RECORD_FILE}"],
            "env": {"GREETING": "${UNSET_VARIABLE:-hello}", "LEVEL": "${SET_VARIABLE:-unused}",
                    "GIVEN_TOKEN": "${MY_SECRET_TOKEN}", "GIVEN_PASSED": "${PASSED_KEY}"}}
    config = json.dumps({"mcpServers": {"t": spec}})
    if not mine:
        (workspace / ".mcp.json").write_text(config)
        approve_project(workspace)
    server = serve(lambda body: reply("ok"))
    env = {"PYTHON_FOR_MCP": sys.executable, "SERVER_SCRIPT": str(SERVER), "RECORD_FILE": str(record),
           "SET_VARIABLE": "debug", "PLAIN_VARIABLE": "plain", "MY_SECRET_TOKEN": "tok-1", "DB_PASSWORD": "pw-2",
           "AWS_SECRET_ACCESS_KEY": "aws-3", "ANTHROPIC_API_KEY": "ant-4", "PASSED_KEY": "passed-5"}
    flags = ["--mcp-config", config] if mine else []
    result = run(["-p", "go", "--pass-env", "PASSED_KEY", *flags], cwd=workspace, base_url=server.url, env=env)
    assert result.code == 0, result.stderr
    assert tool_names(server.bodies[0]) - BUILTINS == {"mcp__t__echo"}
    started = records(record)[0]
    assert started["argv"] == ["--only", "echo", "--record", str(record)]
    seen = started["env"]
    assert (seen["GREETING"], seen["LEVEL"], seen["PLAIN_VARIABLE"]) == ("hello", "debug", "plain")
    assert seen["GIVEN_PASSED"] == "passed-5"  # passed by name: commands may see it, so may a project's config
    assert seen["GIVEN_TOKEN"] == ("tok-1" if mine else "")  # the user's config passes it on purpose
    assert "tok-1" not in result.stderr
    assert result.stderr == ("" if mine else "solo: left out of .mcp.json's servers, as if unset: MY_SECRET_TOKEN "
                             "(secret-looking variables reach a project's servers only when passed by name: "
                             "SOLO_PASS_ENV or --pass-env)\n")
    assert seen["PASSED_KEY"] == "passed-5"  # --pass-env
    assert not {"OPENROUTER_API_KEY", "MY_SECRET_TOKEN", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY", "ANTHROPIC_API_KEY"} & set(seen)
    assert "sk-test-secret-123" not in json.dumps(seen)


MALFORMED = {
    "not json": ("inline", "{not json"),
    "no mcpServers": ("inline", '{"servers": {}}'),
    "mcpServers a list": ("inline", '{"mcpServers": []}'),
    "server a string": ("inline", '{"mcpServers": {"x": "python server.py"}}'),
    "a list": ("inline", "[1, 2]"),
    "env a list": ("inline", '{"mcpServers": {"x": {"command": "python3", "env": ["A=1"]}}}'),
    "args a string": ("inline", '{"mcpServers": {"x": {"command": "python3", "args": "server.py --flag"}}}'),
    "headers a list": ("inline", '{"mcpServers": {"x": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": ["A: 1"]}}}'),
    "file not json": ("file", "{not json"),
    "no such file": ("file", None),
    ".mcp.json server a number": (".mcp.json", '{"mcpServers": {"x": 1}}'),
    ".mcp.json empty": (".mcp.json", ""),
}


@pytest.mark.parametrize("where, config", MALFORMED.values(), ids=MALFORMED)
def test_a_malformed_config_is_one_usage_line_and_nothing_is_sent(serve, run, workspace, pidfile, where, config):
    never = pidfile("never")
    good = mcp_config(good=stdio("--only", "echo", "--pidfile", str(never)))
    path = workspace / ".mcp.json" if where == ".mcp.json" else workspace.parent / "bad.json"
    if config is not None and where != "inline":
        path.write_text(config)
    args = ["--mcp-config", good] + ([] if where == ".mcp.json" else ["--mcp-config", config if where == "inline" else str(path)])
    server = serve(lambda body: reply("never"))
    result = run(["-p", "go", *args], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout, server.bodies) == (2, "", [])
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("solo: "), result.stderr
    assert "MCP config" in result.stderr
    assert not never.exists()


@pytest.mark.parametrize("name, value", [("MCP_TIMEOUT", "0"), ("MCP_TIMEOUT", "soon"), ("MCP_TOOL_TIMEOUT", "-5")])
def test_a_bad_mcp_timeout_is_a_usage_error(serve, run, workspace, name, value):
    server = serve(lambda body: reply("never"))
    result = run(["-p", "go", "--mcp-config", mcp_config(t=stdio("--only", "echo"))], cwd=workspace,
                 base_url=server.url, env={name: value})
    assert (result.code, server.bodies) == (2, [])
    assert result.stderr.count("\n") == 1 and name in result.stderr


# --- 2. Tools in the request ----------------------------------------------------------------------


def test_tools_are_advertised_with_the_servers_description_and_an_object_schema(serve, run, workspace):
    server = serve(lambda body: reply("ok"))
    result = run(["-p", "go", "--mcp-config", mcp_config(t=stdio("--only", "echo,peek,bare,args"))],
                 cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    specs = {tool["function"]["name"]: tool for tool in server.bodies[0]["tools"]}
    assert set(specs) == BUILTINS | {"mcp__t__echo", "mcp__t__peek", "mcp__t__bare", "mcp__t__args"}
    assert specs["mcp__t__echo"] == {"type": "function", "function": {
        "name": "mcp__t__echo", "description": "Echo the text back (test server)",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
    assert specs["mcp__t__peek"]["function"]["parameters"] == {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": []}
    assert specs["mcp__t__bare"]["function"]["description"] == "Bare tool"  # its title, having no description
    assert specs["mcp__t__bare"]["function"]["parameters"] == {"type": "object", "properties": {}, "required": []}
    assert specs["mcp__t__args"]["function"]["parameters"]["additionalProperties"] is True


def test_names_are_squeezed_to_64_allowed_characters_unique_and_still_reach_their_tool(serve, run, workspace):
    odd = ["get weather/now", "a.b", "a_b", "x" * 80, "x" * 70 + "y", "ünïcode"]
    config = mcp_config(**{"my.server": stdio("--only", "echo", *[arg for name in odd for arg in ("--tool", name)])})

    def model(body):
        if body["messages"][-1]["role"] == "user":
            return reply(tool_calls=[call(t["function"]["name"], {"text": "hi"}) for t in body["tools"]
                                     if t["function"]["description"].startswith("Echo as ")])
        return reply(json.dumps(tool_results(body)))

    server = serve(model)
    result = run(["-p", "go", "--mcp-config", config], cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    mcp = [t["function"] for t in server.bodies[0]["tools"] if t["function"]["name"].startswith("mcp__")]
    names = [f["name"] for f in mcp]
    assert len(names) == len(set(names)) == len(odd) + 1
    assert all(NAME.fullmatch(name) for name in names), names
    assert "mcp__my_server__echo" in names and "mcp__my_server__get_weather_now" in names
    # each advertised name runs the tool its description names
    echoed = [f["description"].removeprefix("Echo as ") for f in mcp if f["description"].startswith("Echo as ")]
    assert json.loads(result.stdout) == [f"{name}: hi" for name in echoed]
    assert sorted(echoed) == sorted(odd)


CHOICES = [  # Claude Code's rules: a deny of a whole tool or server takes it off the offer (a call is no tool)
    (["--allowed-tools", "Read,mcp__t__echo"], set()),
    (["--allowed-tools", "mcp__u"], set()),
    (["--disallowed-tools", "mcp__t__echo"], {"mcp__t__echo"}),
    (["--disallowed-tools", "mcp__t,Bash"], {"mcp__t__echo", "mcp__t__peek", "Bash"}),
    (["--disallowed-tools", "mcp__t__*"], {"mcp__t__echo", "mcp__t__peek"}),
    (["--allowed-tools", "mcp__t", "--disallowed-tools", "mcp__t__peek"], {"mcp__t__peek"}),
    (["--disallowed-tools", "mcp__u"], {"mcp__u__echo"}),
]


@pytest.mark.parametrize("flags, withheld", CHOICES, ids=[" ".join(flags) for flags, _ in CHOICES])
def test_allowed_and_disallowed_tools_are_rules_by_tool_and_by_server(serve, run, workspace, flags, withheld):
    config = mcp_config(t=stdio("--only", "echo,peek"), u=stdio("--only", "echo"))
    server = serve(calls_then_results([call("mcp__t__echo", {"text": "hi"})]))
    result = run(["-p", "go", "--mcp-config", config, *flags], cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    assert tool_names(server.bodies[0]) == (BUILTINS | {"mcp__t__echo", "mcp__t__peek", "mcp__u__echo"}) - withheld
    outcome = json.loads(result.stdout)[0]
    assert outcome.startswith("Error: no tool called mcp__t__echo") if "mcp__t__echo" in withheld else \
        outcome == "echo: hi"


# --- 3. Calls -------------------------------------------------------------------------------------


def parts_described(result: str) -> bool:
    """The parts tool's result: texts as they are, each other part one line naming its kind and type."""
    lines = result.splitlines()
    return (len(lines) == 6 and lines[0] == "caption" and lines[3] == "inside the resource"
            and "image" in lines[1] and "image/png" in lines[1] and "audio/wav" in lines[2]
            and "resource" in lines[4] and "application/octet-stream" in lines[4]
            and "resource_link" in lines[5] and "file:///linked.txt" in lines[5]
            and "iVBOR" not in result and "AAECAw" not in result)


CALLS = {
    "text": ("echo", {"text": "hi there"}, lambda r: r == "echo: hi there"),
    "parts described": ("parts", {}, parts_described),
    "structuredContent alone": ("struct", {}, lambda r: json.loads(r) == {"temperature": 21.5, "unit": "C",
                                                                         "tags": ["dry", "sunny"]}),
    "text beside structuredContent": ("struct", {"with_text": True}, lambda r: r == "21.5 C"),
    "an empty text part": ("blank", {}, lambda r: r in ("first\n\nlast", "first\nlast")),
    "isError": ("fail", {}, lambda r: r == "Error: it went wrong"),
    "JSON-RPC error": ("rpc_error", {}, lambda r: r.startswith("Error:") and "boom" in r),
    "huge result bounded": ("huge", {"size": 1_000_000}, lambda r: r.startswith("HEAD") and r.endswith("TAIL")
                            and "omitted" in r and len(r) <= agent.RESULT_LIMIT + 200),
    "missing required input": ("echo", {}, lambda r: r == "Error: missing input text"),
    "nested arguments": ("args", {"count": 3, "tags": ["a", "b"], "opts": {"deep": [1, {"x": None}]}},
                         lambda r: json.loads(r) == {"count": 3, "tags": ["a", "b"], "opts": {"deep": [1, {"x": None}]}}),
    "arguments beyond the schema": ("args", {"count": 2, "extra": "kept"},
                                    lambda r: json.loads(r) == {"count": 2, "extra": "kept"}),
    "arguments of a tool without a schema": ("bare", {"anything": 1}, lambda r: json.loads(r) == {"anything": 1}),
}


@pytest.mark.parametrize("tool, args, check", CALLS.values(), ids=CALLS)
def test_a_call_result_as_the_model_reads_it(serve, run, workspace, tool, args, check):
    server = serve(tool_then([call(f"mcp__t__{tool}", args)], "done"))
    result = run(["-p", "go", "--mcp-config", mcp_config(t=stdio())], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "done\n"), result.stderr
    content = last_result(server.bodies[1])
    assert check(content), content[:500]


def test_a_call_past_mcp_tool_timeout_is_an_error_and_the_run_goes_on(serve, run, workspace):
    calls = [call("mcp__t__sleep", {"seconds": 60}), call("mcp__t__echo", {"text": "after"})]
    server = serve(calls_then_results(calls))
    started = time.monotonic()
    result = run(["-p", "go", "--mcp-config", mcp_config(t=stdio())], cwd=workspace, base_url=server.url,
                 env={"MCP_TOOL_TIMEOUT": "1"})
    assert result.code == 0, result.stderr
    late, after = json.loads(result.stdout)
    assert late.startswith("Error: ") and "1 s" in late, late
    assert after == "echo: after"
    assert time.monotonic() - started < 30


def test_after_a_server_crashes_its_calls_say_it_is_not_running(serve, run, workspace):
    calls = [call("mcp__t__crash", {}), call("mcp__t__echo", {"text": "still there?"}), call("Bash", {"command": "echo alive"})]
    server = serve(calls_then_results(calls))
    result = run(["-p", "go", "--mcp-config", mcp_config(t=stdio())], cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    crashed, later, bash = json.loads(result.stdout)
    assert crashed.startswith("Error: ")
    assert later == "Error: MCP server t is not running"
    assert bash == "alive\n[exit code 0]"


def test_plan_mode_offers_only_read_only_mcp_tools(serve, run, workspace):
    calls = [call("mcp__t__echo", {"text": "x"}), call("mcp__t__peek", {"text": "y"})]
    server = serve(calls_then_results(calls))
    result = run(["-p", "go", "--permission-mode", "plan", "--mcp-config", mcp_config(t=stdio("--only", "echo,peek"))],
                 cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    assert tool_names(server.bodies[0]) == {"Read", "Glob", "Grep", "BashOutput", "WebFetch", "WebSearch", "TodoWrite",
                                            "Agent", "mcp__t__peek"}
    denied, peeked = json.loads(result.stdout)
    assert denied.startswith("Error: permission denied: plan mode") and peeked == "peek: y"


# --- 4. Lifecycle ---------------------------------------------------------------------------------


FAILING = {
    "missing command": lambda ws, pids: {"command": str(ws / "no-such-server")},
    "no command": lambda ws, pids: {"args": ["x"]},
    "exits at start": lambda ws, pids: stdio("--exit-at-start", "3", "--stderr", "server noise"),
    "slow initialize": lambda ws, pids: stdio("--init-delay", "60", "--pidfile", str(pids)),
    "unsupported type": lambda ws, pids: {"type": "sse", "url": "http://127.0.0.1:9/sse"},
    "http refused": lambda ws, pids: {"type": "http", "url": "http://127.0.0.1:9/mcp"},
}
SAYS = {"missing command": "No such file", "no command": "it has no command", "slow initialize": "did not answer",
        "unsupported type": "is not supported", "http refused": "127.0.0.1"}  # each warning says why


@pytest.mark.parametrize("case", FAILING)
def test_a_server_that_fails_to_start_is_one_warning_and_the_run_goes_on(serve, run, workspace, pidfile, case):
    pids = pidfile()
    config = mcp_config(ok=stdio("--only", "echo"), bad=FAILING[case](workspace, pids))
    server = serve(calls_then_results([call("mcp__ok__echo", {"text": "fine"})]))
    started = time.monotonic()
    result = run(["-p", "go", "--mcp-config", config], cwd=workspace, base_url=server.url, env={"MCP_TIMEOUT": "5"})
    assert result.code == 0 and json.loads(result.stdout) == ["echo: fine"], result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("solo: MCP server bad "), result.stderr
    assert SAYS.get(case, "failed: ") in lines[0]
    assert tool_names(server.bodies[0]) == BUILTINS | {"mcp__ok__echo"}
    assert time.monotonic() - started < 30  # a slow server is given up after MCP_TIMEOUT, not waited for
    if pids.exists():
        assert all_gone(server_pids(pids))


def test_tools_list_pages_are_followed(serve, run, workspace):
    record = workspace.parent / "record"
    server = serve(lambda body: reply("ok"))
    config = mcp_config(t=stdio("--only", "echo,peek,bare,fail,huge", "--page", "2", "--record", str(record)))
    result = run(["-p", "go", "--mcp-config", config], cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    assert tool_names(server.bodies[0]) - BUILTINS == {f"mcp__t__{n}" for n in ("echo", "peek", "bare", "fail", "huge")}
    pages = [r["message"].get("params") for r in records(record) if r["event"] == "message"
             and r["message"].get("method") == "tools/list"]
    assert pages == [{}, {"cursor": "2"}, {"cursor": "4"}]


def test_handshake_and_the_servers_own_requests_are_answered(serve, run, workspace):
    record = workspace.parent / "record"
    server = serve(calls_then_results([call("mcp__t__echo", {"text": "hi"})]))
    config = mcp_config(t=stdio("--ask-client", "--stdout-noise", "--record", str(record)))
    result = run(["-p", "go", "--mcp-config", config], cwd=workspace, base_url=server.url)
    assert (result.code, json.loads(result.stdout or "null")) == (0, ["echo: hi"]), result.stderr
    assert result.stderr == ""  # the log notification and the noise line stay off the terminal
    seen = records(record)
    assert methods(record)[:3] == ["initialize", "notifications/initialized", "tools/list"]
    hello = seen[1]["message"]["params"]
    assert hello["protocolVersion"] == "2025-06-18" and "roots" in hello["capabilities"]
    assert hello["clientInfo"]["name"] == "solo"
    answers = {r["method"]: r["message"] for r in seen if r["event"] == "answer"}
    assert answers["ping"] == {"jsonrpc": "2.0", "id": "s-ping", "result": {}}
    roots = answers["roots/list"]["result"]["roots"]
    assert [root["uri"] for root in roots] == [workspace.resolve().as_uri()]
    assert answers["sampling/createMessage"]["error"]["code"] == -32601


@pytest.mark.parametrize("flags, on_stderr, in_trace", [
    ([], False, False),
    (["--verbose"], True, False),
    (["--trace", "TRACE"], False, True),
], ids=["plain", "verbose", "trace"])
def test_server_stderr_shows_only_with_verbose_or_in_the_trace(serve, run, workspace, flags, on_stderr, in_trace):
    trace = workspace.parent / "trace.jsonl"
    flags = [str(trace) if flag == "TRACE" else flag for flag in flags]
    server = serve(calls_then_results([call("mcp__t__echo", {"text": "hi"})]))
    config = mcp_config(t=stdio("--stderr", "a line the server logs"))
    result = run(["-p", "go", "--mcp-config", config, *flags], cwd=workspace, base_url=server.url)
    assert result.code == 0 and json.loads(result.stdout) == ["echo: hi"], result.stderr
    assert ("a line the server logs" in result.stderr) == on_stderr, result.stderr
    assert ("a line the server logs" in (trace.read_text() if trace.exists() else "")) == in_trace


STOPS = [
    ("after the answer", None, "plain", 0),
    ("after the answer", None, "child ignores SIGTERM", 0),
    ("after the answer", None, "server ignores SIGTERM", 0),
    ("during a call", signal.SIGTERM, "plain", 143),
    ("during a call", signal.SIGINT, "plain", 130),
    ("during a call", signal.SIGTERM, "child ignores SIGTERM", 143),
    ("during a batch", signal.SIGINT, "plain", 130),
    ("during start-up", signal.SIGTERM, "plain", 143),
    ("during start-up", signal.SIGINT, "plain", 130),
]
KINDS = {"plain": [], "child ignores SIGTERM": ["--child", "stubborn"], "server ignores SIGTERM": ["--ignore-term"]}


@pytest.mark.parametrize("when, sig, kind, code", STOPS,
                         ids=[f"{when}, {sig.name if sig else 'exit'}, {kind}" for when, sig, kind, _ in STOPS])
def test_every_server_process_group_ends_with_the_program(serve, workspace, pidfile, when, sig, kind, code):
    """Each server and its child are gone when the program ends, however it ends."""
    record = workspace.parent / "record"
    files = [pidfile("pids-t"), pidfile("pids-u")]
    extra = KINDS[kind] + (["--init-delay", "60"] if when == "during start-up" else [])
    config = mcp_config(**{name: stdio("--pidfile", str(path), "--record", str(record), *extra)
                           for name, path in zip("tu", files)})
    calls = {"during a call": [call("mcp__t__sleep", {"seconds": 60})],
             "during a batch": [call("mcp__t__sleep", {"seconds": 60}), call("mcp__u__sleep", {"seconds": 60})]}
    server = serve(tool_then(calls[when], "done") if when in calls else lambda body: reply("done"))
    proc = start(["-p", "go", "--mcp-config", config], workspace, server.url, {"MCP_TIMEOUT": "120"})
    try:
        pids = [pid for path in files for pid in server_pids(path)]
        if sig:
            waited, count = ("initialize", 2) if when == "during start-up" else ("tools/call", len(calls[when]))
            wait_for(lambda: methods(record).count(waited) >= count, f"{count} {waited}")
            proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr
    starts = [r for r in records(record) if r["event"] == "start"]
    assert len(starts) == 2 and all(r["sid"] == r["pid"] == r["pgid"] for r in starts)  # a terminal's Ctrl-C misses it
    assert all_gone(pids), [(pid, ours(pid)) for pid in pids]


def test_malformed_tool_entries_do_not_break_the_run(serve, run, workspace, pidfile):
    pids = pidfile()
    config = mcp_config(t=stdio("--only", "echo", "--odd-tools", "--pidfile", str(pids)))
    server = serve(calls_then_results([call("mcp__t__echo", {"text": "hi"})]))
    result = run(["-p", "go", "--mcp-config", config], cwd=workspace, base_url=server.url)
    assert result.code == 0 and json.loads(result.stdout or "null") == ["echo: hi"], result.stderr
    for tool in server.bodies[0]["tools"]:  # what a provider would refuse the whole request for
        function = tool["function"]
        assert NAME.fullmatch(function["name"]) and isinstance(function["description"], str)
        assert function["parameters"]["type"] == "object" and isinstance(function["parameters"]["properties"], dict)
        assert all(isinstance(name, str) for name in function["parameters"].get("required", [])), function
        assert isinstance(function["parameters"].get("required", []), list), function
    assert all_gone(server_pids(pids))


def test_a_tool_list_that_is_not_a_list_fails_that_server_in_one_line(serve, run, workspace, pidfile):
    pids = pidfile()
    config = mcp_config(ok=stdio("--only", "echo"), bad=stdio("--tools-not-a-list", "--pidfile", str(pids)))
    server = serve(lambda body: reply("answered"))
    result = run(["-p", "go", "--mcp-config", config], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "answered\n"), result.stderr
    assert "Traceback" not in result.stderr  # was: a thread's traceback, then "failed: ;" with no reason
    assert result.stderr == ("solo: MCP server bad failed: its answer to tools/list is not of the protocol; "
                             "going on without it\n")
    assert tool_names(server.bodies[0]) == BUILTINS | {"mcp__ok__echo"}
    assert all_gone(server_pids(pids))


def test_a_server_whose_tool_pages_never_end_does_not_hang_the_start(serve, run, workspace, pidfile):
    pids = pidfile()
    config = mcp_config(ok=stdio("--only", "echo"),
                        loop=stdio("--only", "echo,peek", "--page", "1", "--endless-pages", "--pidfile", str(pids)))
    server = serve(lambda body: reply("answered"))
    started = time.monotonic()
    try:
        result = run(["-p", "go", "--mcp-config", config], cwd=workspace, base_url=server.url,
                     env={"MCP_TIMEOUT": "5"}, timeout=40)
    except subprocess.TimeoutExpired:
        raise AssertionError("the program was still starting its MCP servers after 40 s") from None
    assert (result.code, result.stdout) == (0, "answered\n"), result.stderr
    assert "mcp__ok__echo" in tool_names(server.bodies[0])
    assert time.monotonic() - started < 30


# --- 5. stream-json -------------------------------------------------------------------------------


def test_stream_json_init_lists_the_servers_and_their_status(serve, run, workspace):
    config = mcp_config(ok=stdio("--only", "echo"), bad={"command": str(workspace / "missing")})
    server = serve(lambda body: reply("ok"))
    result = run(["-p", "go", "--output-format", "stream-json", "--mcp-config", config], cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    init = json.loads(result.stdout.splitlines()[0])
    assert (init["type"], init["subtype"]) == ("system", "init")
    statuses = {s["name"]: s["status"] for s in init["mcp_servers"]}
    assert set(statuses) == {"ok", "bad"} and statuses["ok"] == "connected"
    assert statuses["bad"] == "failed" or statuses["bad"].startswith("failed:")
    assert "mcp__ok__echo" in init["tools"]


# --- 6. A published server ------------------------------------------------------------------------


def test_the_published_mcp_server_time_works_through_the_agent(serve, run, workspace):
    assert TIME_SERVER.exists(), "tests/setup.sh installs mcp-server-time (the test extra)"
    server = serve(tool_then([call("mcp__time__get_current_time", {"timezone": "Europe/Paris"})], last_result))
    config = mcp_config(time={"command": str(TIME_SERVER), "args": ["--local-timezone", "UTC"]})
    result = run(["-p", "what time is it in Paris?", "--mcp-config", config], cwd=workspace, base_url=server.url,
                 env={"MCP_TIMEOUT": "60"})
    assert result.code == 0, result.stderr
    specs = {t["function"]["name"]: t["function"] for t in server.bodies[0]["tools"]}
    assert "timezone" in specs["mcp__time__get_current_time"]["parameters"]["properties"]
    assert specs["mcp__time__get_current_time"]["description"]
    answer = json.loads(result.stdout)
    assert answer["timezone"] == "Europe/Paris" and re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", answer["datetime"])


# --- 7. Read-only calls of one reply run at once --------------------------------------------------


def test_four_read_only_mcp_calls_of_one_second_take_about_one_second_in_order(serve, run, workspace):
    calls = [call("mcp__t__sleep", {"seconds": 1, "tag": f"#{i}"}) for i in range(4)]
    server = serve(calls_then_results(calls))
    result = run(["-p", "go", "--mcp-config", mcp_config(t=stdio())], cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout) == [f"slept 1 #{i}" for i in range(4)]
    assert server.times[1] - server.times[0] < 3  # one after another they take 4 s


def test_searches_and_mcp_calls_of_one_reply_run_at_once_and_answer_in_call_order(serve, run, workspace):
    for word in ("alpha", "beta", "gamma"):
        (workspace / f"{word}.txt").write_text(f"{word} here\n")
    calls = [call("Grep", {"pattern": "alpha"}), call("mcp__t__sleep", {"seconds": 1, "tag": "a"}),
             call("Grep", {"pattern": "gamma", "output_mode": "content"}), call("Grep", {"pattern": "nowhere"}),
             call("mcp__t__sleep", {"seconds": 1, "tag": "b"}), call("Glob", {"pattern": "b*.txt"}),
             call("Grep", {"pattern": "beta", "output_mode": "count"}), call("Grep", {"pattern": "("}),
             call("mcp__t__sleep", {"seconds": 1, "tag": "c"})]
    server = serve(calls_then_results(calls))
    result = run(["-p", "go", "--mcp-config", mcp_config(t=stdio("--only", "sleep"))], cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    found = json.loads(result.stdout)
    assert found[:7] == ["alpha.txt", "slept 1 a", "gamma.txt:1:gamma here", "No matches found", "slept 1 b",
                         "beta.txt", "beta.txt:1"]
    assert found[7].startswith("Error: invalid regular expression") and found[8] == "slept 1 c"
    assert server.times[1] - server.times[0] < 2.5  # the three waits alone take 3 s one after another


def test_the_search_time_limit_holds_inside_a_batch(ctx, tmp_path, monkeypatch):
    monkeypatch.setattr(agent, "SEARCH_SECONDS", 0.5)
    (tmp_path / "runaway.txt").write_text("a" * 60 + "b\n")
    (tmp_path / "plain.txt").write_text("needle\n")
    calls = [call("Grep", {"pattern": "(a+)+$"}), call("Grep", {"pattern": "needle"}),
             call("Read", {"file_path": "plain.txt"}), call("Glob", {"pattern": "*.txt"})]
    tools = {tool.name: tool for tool in agent.TOOLS}
    started = time.monotonic()
    results = agent.run_batch(calls, tools, ctx)
    assert time.monotonic() - started < 10
    assert results[0].startswith("No matches found\n[search stopped after"), results[0]
    assert results[1:3] == ["plain.txt", "needle\n"]
    assert set(results[3].splitlines()) == {"runaway.txt", "plain.txt"}


def test_calls_that_change_things_run_alone_and_in_order(serve, run, workspace):
    (workspace / "f.txt").write_text("before\n")
    calls = [call("Read", {"file_path": "f.txt"}), call("mcp__t__sleep", {"seconds": 0.3, "tag": "a"}),
             call("Bash", {"command": "sleep 0.5; echo first >> log.txt; echo after > f.txt"}),
             call("mcp__t__echo", {"text": "between"}), call("Write", {"file_path": "new.txt", "content": "x"}),
             call("Bash", {"command": "echo second >> log.txt"}),
             call("Read", {"file_path": "f.txt"}), call("Read", {"file_path": "log.txt"}),
             call("Glob", {"pattern": "*.txt"}), call("mcp__t__peek", {"text": "end"})]
    server = serve(calls_then_results(calls))
    result = run(["-p", "go", "--mcp-config", mcp_config(t=stdio("--only", "sleep,echo,peek"))], cwd=workspace,
                 base_url=server.url)
    assert result.code == 0, result.stderr
    found = json.loads(result.stdout)
    assert found[:2] == ["before\n", "slept 0.3 a"]
    assert found[3] == "echo: between"
    assert found[6:8] == ["after\n", "first\nsecond\n"]
    assert set(found[8].splitlines()) == {"f.txt", "log.txt", "new.txt"} and found[9] == "peek: end"


def test_a_failing_call_in_a_batch_does_not_cancel_the_others(serve, run, workspace):
    (workspace / "ok.txt").write_text("fine\n")
    calls = [call("Read", {"file_path": "missing.txt"}), call("mcp__t__sleep", {"seconds": 0.5, "tag": "a"}),
             call("Grep", {"pattern": "("}), call("mcp__t__fail", {}), call("mcp__t__rpc_error", {}),
             call("Read", {"file_path": "ok.txt"}), call("mcp__t__sleep", {"seconds": 0.2, "tag": "b"})]
    server = serve(calls_then_results(calls))
    result = run(["-p", "go", "--mcp-config", mcp_config(t=stdio())], cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    found = json.loads(result.stdout)
    assert found[0].startswith("Error: file not found: missing.txt")
    assert found[1] == "slept 0.5 a"
    assert found[2].startswith("Error: invalid regular expression")
    assert found[3] == "Error: it went wrong"
    assert found[4].startswith("Error:") and "boom" in found[4]
    assert found[5:] == ["fine\n", "slept 0.2 b"]


# --- 8. In a session ------------------------------------------------------------------------------


def test_slash_mcp_lists_the_servers_state_and_tool_count(serve, terminal, workspace):
    config = mcp_config(t=stdio("--only", "echo,peek,crash"), bad={"command": "/no/such/server"})
    (workspace / ".mcp.json").write_text(config)
    approve_project(workspace)
    server = serve(tool_then([call("mcp__t__crash", {})], lambda body: "after: " + last_result(body)))
    term = terminal(server, env=program_env(workspace, server.url))  # the home where the approval is
    term.send("/mcp\r")
    term.expect(r"solo: t: connected, 3 tools\r\n")
    term.expect(r"solo: bad: failed[^\r\n]*, 0 tools\r\n")
    term.expect(PROMPT)
    term.send("crash it\r")
    term.expect(r"Allow mcp__t__crash\? \[y/n/a/s\] ")
    term.send("y\r")
    term.expect("after: Error: ")
    term.expect(PROMPT)
    term.send("/mcp\r")
    term.expect(r"solo: t: failed[^\r\n]*\r\n")
    term.expect(PROMPT)
    term.send("/exit\r")
    assert term.wait() == 0


def test_ctrl_c_during_an_mcp_call_cancels_the_turn_and_the_server_still_answers(serve, terminal, workspace):
    record = workspace.parent / "record"
    (workspace / ".mcp.json").write_text(mcp_config(t=stdio("--only", "sleep,peek", "--record", str(record))))
    approve_project(workspace)

    def model(body):
        last = body["messages"][-1]
        if last["role"] == "user":
            slow = last["content"] == "slow"
            return reply(tool_calls=[call("mcp__t__sleep", {"seconds": 60}) if slow else call("mcp__t__peek", {"text": "ok"})])
        return reply("result: " + last["content"])

    server = serve(model)
    term = terminal(server, env=program_env(workspace, server.url))  # the home where the approval is
    term.send("slow\r")
    wait_for(lambda: "tools/call" in methods(record), "the sleep call")
    started = time.monotonic()
    term.send("\x03")
    term.expect("cancelled")
    term.expect(PROMPT)
    assert time.monotonic() - started < 10
    term.send("quick\r")
    term.expect("result: peek: ok")
    term.expect(PROMPT)
    term.send("/exit\r")
    assert term.wait() == 0


def test_an_mcp_tool_that_changes_things_asks_first_and_a_read_only_one_does_not(serve, terminal, workspace):
    record = workspace.parent / "record"
    (workspace / ".mcp.json").write_text(mcp_config(t=stdio("--only", "echo,peek", "--record", str(record))))
    approve_project(workspace, enabledMcpjsonServers=["t"])

    def model(body):
        last = body["messages"][-1]
        if last["role"] == "user":
            tool = "mcp__t__peek" if last["content"] == "look" else "mcp__t__echo"
            return reply(tool_calls=[call(tool, {"text": "hi"})])
        return reply("result: " + last["content"])

    server = serve(model)
    term = terminal(server, env=program_env(workspace, server.url))  # the home where the approval is
    term.send("look\r")
    shown = term.expect("result: peek: hi")
    term.expect(PROMPT)
    assert "Allow" not in shown
    term.send("change it\r")
    shown = term.expect(r"Allow mcp__t__echo\? \[y/n/a/s\] ")
    assert "hi" in shown
    term.send("n\r")
    term.expect("result: Error: permission denied")
    term.expect(PROMPT)
    called = [r["message"]["params"]["name"] for r in records(record)
              if r["event"] == "message" and r["message"].get("method") == "tools/call"]
    assert called == ["peek"]
    term.send("/exit\r")
    assert term.wait() == 0


# --- 9. Nothing hangs: every wait keeps to its deadline (issue 21) ---------------------------------


MARGIN = 5  # seconds past a deadline that a loaded machine may take; a hang takes for ever


def finishes(work: Callable[[], Any], within: float) -> Any:
    """What work returns (or raises), provided it ends within `within` seconds: a hang fails the test."""
    outcome: list = []

    def attempt() -> None:
        try:
            outcome.append((work(), None))
        except BaseException as error:  # handed to the test
            outcome.append((None, error))

    threading.Thread(target=attempt, daemon=True).start()
    deadline = time.monotonic() + within
    while not outcome:
        assert time.monotonic() < deadline, f"still waiting after {within} s"
        time.sleep(0.02)
    if outcome[0][1]:
        raise outcome[0][1]
    return outcome[0][0]


@pytest.fixture
def mcp(workspace):
    """Start a server of these settings (or the test server with these options) in-process; stopped afterwards."""
    servers: list[agent.McpServer] = []

    def start(*args: str, spec: dict | None = None, timeout: float = 10) -> agent.McpServer:
        servers.append(agent.McpServer("t", spec or stdio(*args), workspace, dict(os.environ), lambda event: None))
        finishes(lambda: servers[-1].start(timeout), timeout + MARGIN)
        return servers[-1]

    yield start
    for server in servers:
        if server.proc:  # first, so that no write to it can block the stopping
            with contextlib.suppress(OSError):
                os.killpg(server.proc.pid, signal.SIGKILL)
        server.stop()


class EndlessHttp:
    """A streamable-HTTP MCP server whose answers to the methods in `endless` are server-sent events that never
    end: the answer, then keep-alive comments (True), or the comments alone (False)."""

    def __init__(self, endless: dict[str, bool]):
        self.stop = stop = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # a stream in chunks, as real servers send it

            def log_message(self, *args: Any) -> None:
                pass

            def chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def do_POST(self) -> None:
                message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                result = {"initialize": {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}},
                          "tools/list": {"tools": [{"name": "wait", "inputSchema": {"type": "object"}}]}}
                answer = json.dumps({"jsonrpc": "2.0", "id": message.get("id"),
                                     "result": result.get(message.get("method"), {})}).encode()
                if "id" not in message or message["method"] not in endless:
                    body = answer if "id" in message else b""
                    self.send_response(200 if body else 202)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.close_connection = True
                with contextlib.suppress(OSError):  # the client went away
                    if endless[message["method"]]:
                        self.chunk(b"data: " + answer + b"\n\n")
                    while not stop.wait(0.05):
                        self.chunk(b": keep-alive\n\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.spec = {"type": "http", "url": f"http://127.0.0.1:{self.httpd.server_address[1]}/mcp"}
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def endless_http():
    made: list[EndlessHttp] = []
    yield lambda endless: made.append(EndlessHttp(endless)) or made[-1]
    for server in made:
        server.close()


def test_http_answers_that_never_end_keep_mcp_timeout_and_mcp_tool_timeout(mcp, endless_http):
    """The answer event then keep-alives for ever is an answer; keep-alives alone are no answer, in time."""
    http = endless_http({"initialize": True, "tools/list": True, "tools/call": False})
    server = mcp(spec=http.spec, timeout=2)
    assert (server.state, [t["name"] for t in server.tools]) == ("connected", ["wait"])
    with pytest.raises(agent.ToolError, match="did not answer tools/call within 1 s"):
        finishes(lambda: server.call("wait", {}, 1), 1 + MARGIN)
    silent = mcp(spec=endless_http({"initialize": False}).spec, timeout=1)
    assert silent.state == "failed" and "did not answer initialize within 1 s" in silent.error


class LateEvent(threading.Event):
    """An event whose waiter wakes a second late, as on a loaded machine."""

    def wait(self, timeout: float | None = None) -> bool:
        return super().wait(None if timeout is None else timeout + 1)


def test_no_answer_in_time_is_said_the_same_whichever_thread_notices_first(mcp, endless_http, monkeypatch):
    """The reading thread may see the deadline pass (a keep-alive after it) before the waiting one wakes: the error
    still names the request and its timeout (it once said only "did not finish its answer in time")."""
    server = mcp(spec=endless_http({"initialize": True, "tools/list": True, "tools/call": False}).spec, timeout=2)
    monkeypatch.setattr(agent.threading, "Event", LateEvent)  # the request's own slot
    with pytest.raises(agent.ToolError, match="did not answer tools/call within 1 s"):
        finishes(lambda: server.call("wait", {}, 1), 1 + MARGIN)


def test_start_up_waits_at_most_mcp_timeout_for_all_servers_together(workspace, monkeypatch):
    """However a start hangs, the run goes on without that server after MCP_TIMEOUT."""
    monkeypatch.setattr(agent.McpServer, "start", lambda self, timeout: time.sleep(600))
    cfg = agent.Config(api_key="k", cwd=workspace, mcp=(("a", stdio()), ("b", stdio())), mcp_timeout=1)
    events: list = []
    servers = finishes(lambda: agent.start_mcp(cfg, list(cfg.mcp), {}, events.append, None), 1 + MARGIN)
    assert [(s.state, s.error) for s in servers] == [("failed", "it did not start within 1 s")] * 2
    assert [e["text"] for e in events] == [f"MCP server {n} failed: it did not start within 1 s; going on without it"
                                           for n in "ab"]


def test_a_call_to_a_server_that_stopped_reading_fails_in_time_and_fails_the_server(mcp):
    server = mcp("--only", "echo", "--stop-reading")
    assert server.state == "connected"
    with pytest.raises(agent.ToolError, match="stopped reading its input"):
        finishes(lambda: server.call("echo", {"text": "x" * 200_000}, 1), 1 + MARGIN)  # more than a pipe holds
    assert (server.state, server.error) == ("failed", "it stopped reading its input")


def test_a_server_that_exits_fails_its_call_at_once_though_its_child_holds_its_output(mcp, pidfile):
    server = mcp("--only", "crash,echo", "--pidfile", str(pidfile()), "--child", "holding")
    started = time.monotonic()
    with pytest.raises(agent.ToolError, match="is not running"):
        finishes(lambda: server.call("crash", {}, 20), 20 + MARGIN)
    assert time.monotonic() - started < MARGIN  # not the whole MCP_TOOL_TIMEOUT
    assert server.state == "failed" and server.error.startswith("the server exited")


def test_a_line_nested_too_deeply_is_skipped_and_the_server_still_answers(mcp):
    server = mcp("--only", "echo", "--deep-line", timeout=5)
    assert server.state == "connected", server.error
    assert server.call("echo", {"text": "hi"}, 10) == "echo: hi"


def test_server_sent_events_are_read_as_they_come_wherever_the_stream_is_split():
    data = b'data: {"a": 1}\r\n\r\n: keep-alive\n\ndata: x\ndata: y\n\ndata: the end, unfinished'
    events = ['{"a": 1}', "x\ny", "the end, unfinished"]
    for cut in range(1, len(data)):
        assert list(agent.sse_data([data[:cut], data[cut:]])) == events, cut
    assert list(agent.sse_data(bytes([byte]) for byte in data)) == events
