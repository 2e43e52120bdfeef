"""End to end: ./your_program.sh as a subprocess in a fresh working directory, against the fake server."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.fake_openrouter import call, last_result, reply, tool_results, tool_then


def last(body: dict) -> dict:
    return body["messages"][-1]


def test_answers_a_prompt(serve, run, workspace):
    server = serve(lambda body: reply("Hello there"))
    result = run(["-p", "Say hello"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "Hello there\n")
    body = server.bodies[0]
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][1]["content"] == "Say hello"
    assert body["model"] == "anthropic/claude-haiku-4.5"
    assert {t["function"]["name"] for t in body["tools"]} == {"Read", "Write", "Edit", "Bash", "Glob", "Grep",
                                                              "BashOutput", "KillShell", "NotebookEdit", "WebFetch",
                                                              "WebSearch", "TodoWrite", "Agent"}
    headers = server.headers[0]
    assert headers["Authorization"] == "Bearer sk-test-secret-123"
    assert headers["HTTP-Referer"] and headers["X-OpenRouter-Title"] == "solo"
    assert "sk-test-secret-123" not in result.stderr + result.stdout


def test_every_request_carries_one_session_id_header_and_no_body_carries_it(serve, run, workspace):
    server = serve(tool_then([call("Bash", {"command": "true"})], "done"))
    result = run(["-p", "x", "--output-format", "json"], cwd=workspace, base_url=server.url)
    ids = {next((v for k, v in headers.items() if k.lower() == "x-session-id"), None) for headers in server.headers}
    assert result.code == 0 and len(server.bodies) == 2 and ids == {json.loads(result.stdout)["session_id"]}
    assert all("session_id" not in body for body in server.bodies)


def test_counts_the_advertised_tools(serve, run, workspace):
    server = serve(lambda body: reply(str(len(body["tools"]))))
    result = run(["-p", "How many tools do you have? Only the number."], cwd=workspace, base_url=server.url + "/")
    assert (result.code, result.stdout.strip()) == (0, "13")  # Read ... Grep, and the toolbox of issue 25
    assert "//" not in server.url.split("://")[1]


def test_prints_a_file_exactly(serve, run, workspace):
    content = "first line\n  second `line` with \"quotes\"\n\nlast line"
    (workspace / "notes.txt").write_text(content)

    server = serve(tool_then([call("Read", {"file_path": "notes.txt"})], last_result))
    result = run(["-p", "Print the exact content of notes.txt"], cwd=workspace, base_url=server.url)
    assert result.code == 0 and result.stdout.rstrip() == content.rstrip()


def test_follows_a_readme_to_a_value(serve, run, workspace):
    (workspace / "README.md").write_text("The secret lives in data/value.txt\n")
    (workspace / "data").mkdir()
    (workspace / "data" / "value.txt").write_text("42\n")

    def model(body):
        results = tool_results(body)
        if last(body)["role"] == "user":
            return reply(tool_calls=[call("Read", {"file_path": "README.md"})])
        if "lives in" in results[0]:
            path = re.search(r"in (\S+)", results[0]).group(1)
            return reply(tool_calls=[call("Read", {"file_path": path})])
        return reply(results[0].strip())

    server = serve(model)
    result = run(["-p", "What is the secret value? Answer with only the number."], cwd=workspace,
                 base_url=server.url)
    assert (result.code, result.stdout) == (0, "42\n")
    assert len(server.bodies) == 3


def test_creates_a_file_in_a_new_folder(serve, run, workspace):
    server = serve(tool_then([call("Write", {"file_path": "out/deep/hello.py", "content": "print('hi')\n"})],
                             "Created the file."))
    result = run(["-p", "Create out/deep/hello.py"], cwd=workspace, base_url=server.url)
    assert result.code == 0 and (workspace / "out/deep/hello.py").read_text() == "print('hi')\n"
    assert tool_results(server.bodies[1])[0].startswith("Created out/deep/hello.py")


def test_lists_and_deletes_an_old_file(serve, run, workspace):
    (workspace / "old.log").write_text("stale")
    (workspace / "keep.txt").write_text("fresh")

    def model(body):
        results = tool_results(body)
        if last(body)["role"] == "user":
            return reply(tool_calls=[call("Bash", {"command": "ls"})])
        if "old.log" in results[0] and "rm" not in str(body["messages"][-2]):
            return reply(tool_calls=[call("Bash", {"command": "rm old.log"})])
        return reply("Deleted old.log")

    server = serve(model)
    result = run(["-p", "Delete the old file"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "Deleted old.log\n")
    assert not (workspace / "old.log").exists() and (workspace / "keep.txt").exists()
    assert "app\nkeep.txt\nold.log" in tool_results(server.bodies[1])[0]


def test_parallel_calls_with_one_failing_are_all_answered_in_order(serve, run, workspace):
    (workspace / "a.txt").write_text("AAA")
    calls = [call("Read", {"file_path": "a.txt"}, id="c1"), call("Read", {"file_path": "missing.txt"}, id="c2"),
             call("Bash", {"command": "echo BBB"}, id="c3")]

    server = serve(tool_then(calls, "done"))
    result = run(["-p", "Read both"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "done\n")
    messages = server.bodies[1]["messages"]
    assert messages[2]["role"] == "assistant" and messages[2]["content"] is None
    assert [(m["role"], m["tool_call_id"]) for m in messages[3:]] == [("tool", "c1"), ("tool", "c2"), ("tool", "c3")]
    assert messages[3]["content"] == "AAA"
    assert messages[4]["content"].startswith("Error: file not found: missing.txt")
    assert messages[5]["content"] == "BBB\n[exit code 0]"


@pytest.mark.parametrize("bad_call, expected", [
    (call("Teleport", {}), "Error: no tool called Teleport"),
    (call("Read", '{"file_path": "a.txt"'), "Error: the arguments were not valid JSON"),
    (call("Read", {}), "Error: missing input file_path"),
    (call("Read", {"file_path": "a.txt", "offset": "zero"}), "Error: input offset should be integer"),
    (call("Write", {"file_path": "app", "content": "x"}), "Error: app is a directory"),
])
def test_bad_calls_come_back_as_errors_and_the_run_goes_on(serve, run, workspace, bad_call, expected):
    server = serve(tool_then([bad_call], "recovered"))
    result = run(["-p", "try"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "recovered\n")
    assert tool_results(server.bodies[1])[0].startswith(expected)


@pytest.mark.parametrize("prompt", ["/ls -la `whoami` \"quoted\" 'single'", "-starts with a dash", "two\nlines"])
def test_any_prompt_text_arrives_unchanged(serve, run, workspace, prompt):
    server = serve(lambda body: reply("ok"))
    result = run(["-p", prompt], cwd=workspace, base_url=server.url)
    assert result.code == 0 and server.bodies[0]["messages"][1]["content"] == prompt


def test_model_from_flag_and_environment(serve, run, workspace):
    server = serve(lambda body: reply(body["model"]))
    assert run(["-p", "x"], cwd=workspace, base_url=server.url,
               env={"OPENROUTER_MODEL": "anthropic/claude-haiku-env"}).stdout == "anthropic/claude-haiku-env\n"
    assert run(["-p", "x", "--model", "anthropic/claude-haiku-flag"], cwd=workspace, base_url=server.url,
               env={"OPENROUTER_MODEL": "anthropic/claude-haiku-env"}).stdout == "anthropic/claude-haiku-flag\n"


def test_missing_key_fails_before_any_request(serve, run, workspace):
    server = serve(lambda body: reply("never"))
    result = run(["-p", "x"], cwd=workspace, base_url=server.url, env={"OPENROUTER_API_KEY": ""})
    assert result.code == 2 and result.stdout == "" and server.bodies == []
    assert result.stderr.strip() == "solo: OPENROUTER_API_KEY is not set; export your OpenRouter API key"


def test_unreadable_reply_is_one_line_without_traceback(serve, run, workspace):
    from tests.fake_openrouter import Raw
    server = serve(lambda body: Raw(400, {"error": {"code": 400, "message": "bad things"}}))
    result = run(["-p", "x"], cwd=workspace, base_url=server.url)
    assert result.code == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == ["solo: HTTP 400: bad things"]


def test_json_request_bodies_round_trip(serve, run, workspace):
    server = serve(lambda body: reply("ok"))
    run(["-p", "ünïcödé ✓"], cwd=workspace, base_url=server.url)
    assert json.loads(server.raw[0])["messages"][1]["content"] == "ünïcödé ✓"


def test_file_names_that_are_not_utf8_do_not_break_a_turn(serve, run, workspace):
    os.close(os.open(bytes(workspace) + b"/caf\xe9.txt", os.O_CREAT | os.O_WRONLY))  # a Latin-1 name

    server = serve(tool_then([call("Glob", {"pattern": "*.txt"})], last_result))
    result = run(["-p", "list"], cwd=workspace, base_url=server.url)
    assert result.code == 0 and result.stdout.startswith("caf") and "Traceback" not in result.stderr
    assert tool_results(server.bodies[1])[0] == "caf?.txt"
