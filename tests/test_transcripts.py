"""Conversations that survive (issue 13): transcripts under SOLO_HOME/projects, end to end.

Every run here is ./your_program.sh against the fake OpenRouter. `run()` gives each run
`cwd.parent / "home"` as HOME, so a workspace's transcripts are in
`<that home>/.solo/projects/<cwd with every non-alphanumeric character as ->/<session id>.jsonl`
(SOLO_HOME, when set, stands for ~/.solo).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from app import main as agent
from tests.conftest import PROGRAM
from tests.fake_openrouter import Raw, call, reply, tool_then
from tests.conftest import PROMPT, Terminal
from tests.test_skills import fork_model, make_skill, skill_md

KEY = "sk-test-secret-123"  # the key run() gives every run
LONG_KEY = "sk-or-v1-" + "0123456789abcdef" * 4  # what an OpenRouter key looks like
ERROR_RESULT = "Error: the session ended before this tool call ran"
RUNNING_RESULT = ("Error: the session ended while this tool call was running: it may have done some or all of its "
                  "work. Check before repeating it.")
GOOD, OTHER = "5e55e55e-0000-4000-8000-00000000000a", "5e55e55e-0000-4000-8000-00000000000b"


# --- Helpers ----------------------------------------------------------------------------------------


def home_of(cwd: Path) -> Path:
    """The HOME that run() gives a run in cwd."""
    return cwd.parent / "home"


def folder(cwd: Path, solo: Path | None = None) -> Path:
    """The folder of cwd's transcripts under a SOLO_HOME (default: ~/.solo of run()'s HOME)."""
    solo = solo or home_of(cwd) / ".solo"
    return solo / "projects" / re.sub(r"[^A-Za-z0-9]", "-", str(cwd.resolve()))


def transcripts(cwd: Path, solo: Path | None = None) -> dict[str, Path]:
    """cwd's transcripts by session id."""
    where = folder(cwd, solo)
    return {p.stem: p for p in where.glob("*.jsonl")} if where.is_dir() else {}


def entries(path: Path) -> list[dict]:
    """Every line of a transcript, parsed (each must be JSON)."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-200:]
    return [json.loads(line) for line in data.split(b"\n")[:-1]]


def messages_of(path: Path) -> list[dict]:
    """A transcript's message lines in order, as the API gets them (events, side chains and the identities of the
    prompts left out: `prompt_ids` reads those)."""
    return [agent.sendable(e) for e in entries(path) if "role" in e]


def prompt_ids(path: Path) -> list[int]:
    """The identities of a transcript's prompts, in order."""
    return [e["prompt_id"] for e in entries(path) if "prompt_id" in e]


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under a folder, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} \
        if root.exists() else {}


def user_turns(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


def header(headers: dict, name: str) -> str | None:
    """An HTTP header the fake server got, whatever its case."""
    return next((v for k, v in headers.items() if k.lower() == name), None)


def result_of(run) -> dict:
    assert run.code == 0, run.stderr
    return json.loads(run.stdout)


def one_line_error(result, *fragments: str) -> None:
    """A usage error: exit 2 and one line on stderr saying what is wrong."""
    lines = result.stderr.strip().splitlines()
    assert result.code == 2 and len(lines) == 1 and lines[0].startswith("solo: "), (result.code, result.stderr)
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def program_env(cwd: Path, base_url: str, **extra: str) -> dict:
    """The environment run() gives the program (for runs a test starts and stops itself)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENROUTER_", "SOLO_"))}
    home_of(cwd).mkdir(exist_ok=True)
    return {**env, "OPENROUTER_BASE_URL": base_url, "OPENROUTER_API_KEY": KEY, "HOME": str(home_of(cwd)), **extra}


def start(args: list[str], cwd: Path, base_url: str, **extra: str) -> subprocess.Popen:
    """The program running in the background, as run() would run it."""
    return subprocess.Popen([str(PROGRAM), *args], cwd=cwd, env=program_env(cwd, base_url, **extra),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_pid(path: Path, timeout: float = 30) -> int:
    """The pid a command wrote once it started (the test's proof that the tool call is running)."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    return int(path.read_text())


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


SLOW = "echo $$ > pid; sleep 60"  # a command that runs until killed; its shell leads its process group


def answers_each_prompt(body: dict) -> dict:
    """A model that answers the last prompt by name (after running `slow` for the prompt 'slow')."""
    last = body["messages"][-1]
    if last["role"] == "user" and last["content"] == "slow":
        return reply(tool_calls=[call("Bash", {"command": SLOW})])
    return reply(f"answer to {user_turns(body)[-1]}")


# --- Resuming ---------------------------------------------------------------------------------------


def tool_then_answer(body: dict) -> dict:
    """The first prompt makes a Bash call; every prompt gets an answer naming it."""
    last = body["messages"][-1]
    if last["role"] == "user" and last["content"] == "first":
        return reply(tool_calls=[call("Bash", {"command": "echo from the tool"})])
    return reply(f"done {user_turns(body)[-1]}")


@pytest.mark.parametrize("how", ["-c", "--continue", "-r ID", "--resume ID", "-r PREFIX"])
def test_resume_resends_the_conversation_byte_for_byte(serve, run, workspace, how):
    server = serve(tool_then_answer)
    decoy = run(["-p", "decoy", "--session-id", GOOD], cwd=workspace, base_url=server.url)
    assert decoy.code == 0
    os.utime(transcripts(workspace)[GOOD], (time.time() - 3600, time.time() - 3600))  # older: -c must skip it
    first = result_of(run(["-p", "first", "--output-format", "json"], cwd=workspace, base_url=server.url))
    sid = first["session_id"]
    assert set(transcripts(workspace)) == {GOOD, sid} and not sid.startswith(GOOD[:8])
    sent = len(server.bodies)
    args = how.replace("ID", sid).replace("PREFIX", sid[:8]).split()
    second = result_of(run([*args, "-p", "second", "--output-format", "json"], cwd=workspace, base_url=server.url))

    assert second["session_id"] == sid and second["result"] == "done second"
    assert set(transcripts(workspace)) == {GOOD, sid}  # the same session went on, in its own file
    previous, body = server.bodies[sent - 1]["messages"], server.bodies[sent]["messages"]
    assert body[: len(previous)] == previous
    assert body[len(previous):] == [{"role": "assistant", "content": "done first"},
                                    {"role": "user", "content": "second"}]
    assert user_turns(server.bodies[sent]) == ["first", "second"]  # nothing of the decoy
    assert server.raw[sent - 1].endswith(b"]}")
    assert server.raw[sent].startswith(server.raw[sent - 1][:-2])  # the provider's cache sees the same prefix
    assert {header(h, "x-session-id") for h in server.headers[sent - 2:]} == {sid}
    assert messages_of(transcripts(workspace)[sid]) == body + [{"role": "assistant", "content": "done second"}]


@pytest.mark.parametrize("calls, results", [
    ([call("Bash", {"command": SLOW}, id="call_slow")], [RUNNING_RESULT]),
    ([call("Bash", {"command": "echo one"}, id="call_one"), call("Bash", {"command": SLOW}, id="call_slow"),
      call("Bash", {"command": "echo three"}, id="call_three")], ["one\n[exit code 0]", RUNNING_RESULT, ERROR_RESULT]),
], ids=["one call", "parallel calls"])
def test_kill_9_in_a_tool_call_resumes_with_an_error_result(serve, run, workspace, calls, results):
    """A call that had started may have done its work: the model is told to check (issue 21, item 6)."""
    def model(body):
        if user_turns(body) == ["go"]:
            return reply(tool_calls=calls)
        return reply("went on")

    server = serve(model)
    proc = start(["-p", "go"], workspace, server.url)
    try:
        shell = wait_for_pid(workspace / "pid")
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        kill_group(shell)
    finally:
        proc.kill()
        proc.wait()
    resumed = run(["-c", "-p", "go on"], cwd=workspace, base_url=server.url)
    assert (resumed.code, resumed.stdout) == (0, "went on\n"), resumed.stderr

    messages = server.bodies[-1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant"] + ["tool"] * len(calls) + ["user"]
    assert [c["id"] for c in messages[2]["tool_calls"]] == [c["id"] for c in calls]
    assert [m["tool_call_id"] for m in messages[3:-1]] == [c["id"] for c in calls]  # each call, in order
    assert [m["content"] for m in messages[3:-1]] == results
    assert messages[-1] == {"role": "user", "content": "go on"}
    assert server.raw[-1].startswith(server.raw[0][:-2])
    again = run(["-c", "-p", "and again"], cwd=workspace, base_url=server.url)  # the repair was saved
    assert again.code == 0 and server.bodies[-1]["messages"][: len(messages)] == messages


@pytest.mark.parametrize("torn", [b'{"role": "user", "content": "half a li', b'{"role": "user", "content": "caf\xc3',
                                  b"{"], ids=["half a line", "half a character", "one byte"])
def test_a_torn_last_line_is_skipped_with_one_warning(serve, run, workspace, torn):
    server = serve(lambda body: reply(f"answer to {user_turns(body)[-1]}"))
    assert run(["-p", "first"], cwd=workspace, base_url=server.url).code == 0
    [path] = transcripts(workspace).values()
    whole = path.read_bytes()
    with open(path, "ab") as f:
        f.write(torn)  # as a kill -9 in the middle of a write leaves it
    resumed = run(["-c", "-p", "second"], cwd=workspace, base_url=server.url)
    assert (resumed.code, resumed.stdout) == (0, "answer to second\n"), resumed.stderr
    assert resumed.stderr.count("unfinished last line") == 1 and str(path) in resumed.stderr
    assert user_turns(server.bodies[-1]) == ["first", "second"]
    data = path.read_bytes()
    assert data.startswith(whole + b'{"role": "user", "content": "second", "prompt_id": 2}\n')  # the torn bytes are gone
    assert messages_of(path)[-2:] == [{"role": "user", "content": "second"},
                                      {"role": "assistant", "content": "answer to second"}]
    again = run(["-c", "-p", "third"], cwd=workspace, base_url=server.url)
    assert again.code == 0 and "unfinished" not in again.stderr


def test_fork_session_copies_the_history_under_a_new_id(serve, run, workspace):
    server = serve(lambda body: reply(f"answer to {user_turns(body)[-1]}"))
    first = result_of(run(["-p", "first", "--output-format", "json"], cwd=workspace, base_url=server.url))
    old = transcripts(workspace)[first["session_id"]]
    before = old.read_bytes()
    forks = {}
    for args in (["-c", "--fork-session"], ["-r", first["session_id"][:8], "--fork-session"],
                 ["-r", first["session_id"], "--fork-session", "--session-id", GOOD]):
        result = result_of(run([*args, "-p", "second", "--output-format", "json"], cwd=workspace, base_url=server.url))
        forks[result["session_id"]] = args
        assert header(server.headers[-1], "x-session-id") == result["session_id"] != first["session_id"]
        assert user_turns(server.bodies[-1]) == ["first", "second"]
        assert server.raw[-1].startswith(server.raw[0][:-2])
        new = transcripts(workspace)[result["session_id"]]
        assert entries(new)[0]["type"] == "header" and entries(new)[0]["session_id"] == result["session_id"]
        answer = {"role": "assistant", "content": "answer to second"}
        assert messages_of(new) == server.bodies[-1]["messages"] + [answer]
        assert prompt_ids(new) == [1, 2]  # a fork keeps the identities of the prompts it copies and goes on from them
        assert old.read_bytes() == before  # the session forked from is untouched
    assert GOOD in forks and len(forks) == 3
    assert set(transcripts(workspace)) == {first["session_id"], *forks}


def test_a_session_open_elsewhere_is_refused_but_can_be_forked(serve, run, workspace):
    server = serve(answers_each_prompt)
    busy = start(["-p", "slow"], workspace, server.url)
    try:
        wait_for_pid(workspace / "pid")
        [sid] = transcripts(workspace)
        path = transcripts(workspace)[sid]
        before, sent = path.read_bytes(), len(server.bodies)
        for args in (["-c"], ["-r", sid], ["-r", sid[:6]]):
            refused = run([*args, "-p", "x"], cwd=workspace, base_url=server.url)
            one_line_error(refused, sid, "--fork-session")
            assert len(server.bodies) == sent and path.read_bytes() == before
        forked = result_of(run(["-c", "--fork-session", "-p", "x", "--output-format", "json"],
                               cwd=workspace, base_url=server.url))
        assert forked["result"] == "answer to x" and forked["session_id"] != sid
        messages = server.bodies[-1]["messages"]
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
        assert messages[3]["content"] == RUNNING_RESULT  # the busy session's call has no result yet
        assert busy.poll() is None and path.read_bytes() == before
    finally:
        with contextlib.suppress(AssertionError):
            kill_group(wait_for_pid(workspace / "pid", timeout=1))
        busy.kill()
        busy.wait()


def test_a_tool_result_shrunk_to_fit_stays_shrunk_when_resumed(serve, run, workspace):
    """A result replaced by a stub after a context-length refusal is saved as a "set" event."""
    def model(body):
        last = body["messages"][-1]
        if last["role"] == "user" and last["content"] == "first":
            return reply(tool_calls=[call("Bash", {"command": "printf '%01000d' 0"})])
        if any(m["role"] == "tool" and len(m["content"]) > 900 for m in body["messages"]):
            return Raw(400, {"error": {"code": 400, "message": "This endpoint's maximum context length is 900 tokens"}})
        return reply(f"done {user_turns(body)[-1]}")

    server = serve(model)
    no_compaction = {"SOLO_COMPACT_AT": "1"}  # the old eliding, which rewrites a message in place
    assert run(["-p", "first"], cwd=workspace, base_url=server.url, env=no_compaction).code == 0
    [path] = transcripts(workspace).values()
    stub = server.bodies[-1]["messages"][3]["content"]
    assert stub.startswith("[removed to fit the context window: ")
    assert [(e["index"], e["message"]["content"]) for e in entries(path) if e.get("type") == "set"] == [(3, stub)]
    sent = len(server.bodies)
    assert run(["-c", "-p", "second"], cwd=workspace, base_url=server.url, env=no_compaction).code == 0
    assert len(server.bodies) == sent + 1 and server.bodies[-1]["messages"][3]["content"] == stub
    assert server.raw[-1].startswith(server.raw[sent - 1][:-2])


# --- What is kept and where -------------------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o000], ids=["umask 022", "umask 000"])
def test_transcripts_are_private_files_in_private_folders(serve, workspace, mask):
    server = serve(lambda body: reply("ok"))
    solo = home_of(workspace) / ".solo"
    env = program_env(workspace, server.url)
    proc = subprocess.run(["sh", "-c", f'umask {mask:03o}; exec "$0" -p hi', str(PROGRAM)], check=False,
                          cwd=workspace, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    [path] = transcripts(workspace).values()
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    for made in (folder(workspace), solo / "projects", solo):  # every folder solo made holds session names
        assert oct(made.stat().st_mode & 0o777) == oct(0o700), made


@pytest.mark.parametrize("api_key", [KEY, LONG_KEY])
def test_no_api_key_reaches_a_transcript(serve, run, workspace, api_key):
    other = "sk-or-v1-" + "fedcba9876543210" * 4
    (workspace / "secrets.txt").write_text(f"mine={api_key}\nsomeone else's={other}\nplain=hello\n")

    def model(body):
        last = body["messages"][-1]
        if last["role"] == "user":
            return reply(tool_calls=[call("Read", {"file_path": "secrets.txt"})])
        return reply("the file says: " + last["content"])

    server = serve(model)
    result = run(["-p", f"read secrets.txt; my key is {api_key}"], cwd=workspace, base_url=server.url,
                 env={"OPENROUTER_API_KEY": api_key})
    assert result.code == 0 and other in server.bodies[-1]["messages"][-1]["content"]  # the model did see the file
    [path] = transcripts(workspace).values()
    data = path.read_text()
    assert api_key not in data and other not in data and "0123456789abcdef" * 4 not in data
    assert "fedcba9876543210" * 4 not in data and "plain=hello" in data  # only the keys were masked
    assert all(isinstance(e, dict) for e in entries(path))


def test_ordinary_words_with_sk_are_not_masked(serve, run, workspace):
    """Words that only contain "sk-" (task-..., disk-...) are not keys: the transcript keeps them as sent."""
    prompt = "run the task-scheduler-configuration-manager on disk-usage-report-for-every-folder"
    server = serve(lambda body: reply(f"answer to {user_turns(body)[-1]}"))
    assert run(["-p", prompt], cwd=workspace, base_url=server.url).code == 0
    [path] = transcripts(workspace).values()
    assert messages_of(path)[1] == {"role": "user", "content": prompt}
    assert run(["-c", "-p", "next"], cwd=workspace, base_url=server.url).code == 0
    assert server.raw[-1].startswith(server.raw[0][:-2])


def test_solo_home_holds_the_transcripts(serve, run, workspace, tmp_path):
    server = serve(lambda body: reply("ok"))
    solo = tmp_path / "elsewhere"
    assert run(["-p", "hi"], cwd=workspace, base_url=server.url, env={"SOLO_HOME": str(solo)}).code == 0
    assert len(transcripts(workspace, solo)) == 1 and not (home_of(workspace) / ".solo").exists()


def test_no_session_persistence_writes_nothing(serve, run, workspace, tmp_path):
    server = serve(lambda body: reply(f"answer to {user_turns(body)[-1]}"))
    solo = tmp_path / "solo-home"
    env = {"SOLO_HOME": str(solo)}
    assert run(["-p", "first", "--no-session-persistence"], cwd=workspace, base_url=server.url, env=env).code == 0
    assert not solo.exists() and not (home_of(workspace) / ".solo").exists()
    # and going on from a saved session without saving leaves that session as it was
    assert run(["-p", "saved"], cwd=workspace, base_url=server.url, env=env).code == 0
    before = snapshot(solo)
    going_on = run(["-c", "-p", "unsaved", "--no-session-persistence"], cwd=workspace, base_url=server.url, env=env)
    assert (going_on.code, going_on.stdout) == (0, "answer to unsaved\n")
    assert user_turns(server.bodies[-1]) == ["saved", "unsaved"]
    assert snapshot(solo) == before


def test_each_prompt_of_a_p_run_is_saved_as_sent(serve, run, workspace):
    """A transcript is the header then the messages exactly as the last request sent them, and a line saying
    which tool calls started before they ran."""
    server = serve(tool_then_answer)
    result = result_of(run(["-p", "first", "--output-format", "json"], cwd=workspace, base_url=server.url))
    [path] = transcripts(workspace).values()
    lines = entries(path)
    assert lines[0]["type"] == "header" and lines[0]["format"] == 1 and lines[0]["session_id"] == path.stem
    assert lines[0]["cwd"] == str(workspace.resolve())
    assert path.stem == result["session_id"] == header(server.headers[0], "x-session-id")
    sent = server.bodies[-1]["messages"]
    started = {"type": "started", "tool_call_ids": [sent[2]["tool_calls"][0]["id"]]}
    usage = [line for line in lines if line.get("type") == "assistant"]  # one per reply, in Claude Code's shape
    claude = [line for line in lines if line.get("type") == "user"]  # the prompt and the tool result, in its shape
    assert [line for line in lines[1:] if line not in usage + claude] == sent[:1] + [{**sent[1], "prompt_id": 1}] + \
        sent[2:3] + [started] + sent[3:] + [{"role": "assistant", "content": "done first"}]  # and the prompt's identity
    assert [line["message"]["content"] for line in claude] == ["first", [
        {"type": "tool_result", "tool_use_id": sent[2]["tool_calls"][0]["id"], "content": sent[3]["content"],
         "is_error": False}]]
    chain = [(line["uuid"], line["parentUuid"]) for line in lines if line.get("uuid")]
    assert [parent for _, parent in chain] == [None] + [uuid for uuid, _ in chain[:-1]]  # one chain, in order
    assert len(usage) == 2 and {u["sessionId"] for u in usage} == {path.stem} and usage[0]["costUSD"] == 0.001
    assert usage[0]["message"]["usage"] == {"input_tokens": 30, "cache_creation_input_tokens": 20,
                                            "cache_read_input_tokens": 50, "output_tokens": 10}
    assert b'"type":"assistant","isSidechain":false' in path.read_bytes()  # ccusage reads only compact lines


def test_ccusage_reports_solo_sessions(serve, run, workspace, tmp_path):
    """ccusage (npm), pointed at SOLO_HOME with CLAUDE_CONFIG_DIR, reads tokens, model and cost."""
    ccusage = shutil.which("ccusage") or os.environ.get("CCUSAGE")
    if not ccusage:
        pytest.skip("ccusage is not installed (npm install ccusage; or set CCUSAGE to its path)")
    server = serve(tool_then_answer)
    solo = tmp_path / "solo-home"
    assert run(["-p", "first"], cwd=workspace, base_url=server.url, env={"SOLO_HOME": str(solo)}).code == 0
    report = subprocess.run([ccusage, "session", "--json", "--offline"], capture_output=True, text=True,
                            env={**os.environ, "CLAUDE_CONFIG_DIR": str(solo)}, timeout=60)
    totals = json.loads(report.stdout)["totals"]
    assert (totals["inputTokens"], totals["cacheReadTokens"], totals["cacheCreationTokens"]) == (60, 100, 40)
    assert totals["outputTokens"] == 20 and totals["totalCost"] == pytest.approx(0.002)


# --- Bad input ---------------------------------------------------------------------------------------


def transcript_text(session_id: str, *lines: str, fmt: int = 1) -> str:
    head = json.dumps({"type": "header", "format": fmt, "session_id": session_id})
    return "\n".join([head, *lines]) + "\n"


SYSTEM, FIRST = '{"role": "system", "content": "s"}', '{"role": "user", "content": "first"}'
ANSWER = '{"role": "assistant", "content": "a"}'
BAD = "0badc0de-0000-4000-8000-000000000001"


@pytest.mark.parametrize("args, files, fragments", [
    (["-r", "0badc0de-0000-4000-8000-0000000000ff"], {}, ["no session", "0badc0de-0000-4000-8000-0000000000ff"]),
    (["-r", "0badc0de"], {}, ["no session", "0badc0de"]),
    (["--resume", "5e55e55e"], {}, ["fits 2 sessions"]),
    (["-r", "5e55e55e-0000-4000-8000-00000000000"], {}, ["fits 2 sessions"]),
    (["-r", BAD], {BAD: transcript_text(BAD, SYSTEM, FIRST, fmt=99)}, ["newer solo", "format 99"]),
    (["-r", BAD], {BAD: transcript_text(BAD, SYSTEM, "{not json", FIRST)}, ["corrupt"]),
    (["-r", BAD], {BAD: transcript_text(BAD, SYSTEM, '{"role": "user", "content": "x', ANSWER)}, ["corrupt"]),
    (["-r", BAD], {BAD: transcript_text(BAD, SYSTEM, "", FIRST)}, ["corrupt"]),
    (["-r", BAD], {BAD: transcript_text(BAD, SYSTEM, "42", FIRST)}, ["corrupt"]),
    (["-r", BAD], {BAD: transcript_text(BAD, SYSTEM, "null", FIRST)}, ["corrupt"]),
    (["-r", BAD], {BAD: transcript_text(BAD, SYSTEM, '["role"]', FIRST)}, ["corrupt"]),
    (["-r", BAD], {BAD: transcript_text(BAD, SYSTEM, '"a role"', FIRST)}, ["corrupt"]),
    (["-r", BAD], {BAD: transcript_text(BAD, SYSTEM, '{"type": "truncate"}', FIRST)}, ["corrupt"]),
    (["-r", BAD], {BAD: transcript_text(BAD, SYSTEM, '{"type": "set", "index": 7, "message": {}}', FIRST)},
     ["corrupt"]),
    (["-r", BAD], {BAD: transcript_text(BAD, SYSTEM, FIRST, '{"type": "truncate", "keep": 1e400}')}, ["corrupt"]),
    (["-r", BAD], {BAD: transcript_text(BAD, SYSTEM, FIRST, '{"role": "assistant", "tool_calls": "abc"}')},
     ["corrupt"]),
    (["-r", BAD], {BAD: transcript_text(BAD, SYSTEM, FIRST, '{"role": "assistant", "tool_calls": [5]}')},
     ["corrupt"]),
    (["-r", BAD], {BAD: transcript_text(BAD, SYSTEM, FIRST, '{"role": "assistant", "tool_calls": [{"id": "a"}]}')},
     ["corrupt"]),
    (["-r", BAD], {BAD: SYSTEM + "\n" + FIRST + "\n"}, ["not a solo transcript"]),
    (["-r", BAD], {BAD: ""}, ["not a solo transcript"]),
    (["--session-id", "not-a-uuid"], {}, ["--session-id", "UUID"]),
    (["--session-id", GOOD.upper()[:-1]], {}, ["--session-id", "UUID"]),
    (["--session-id", GOOD], {}, [GOOD, "exists"]),
    (["-c", "--session-id", BAD], {}, ["--fork-session"]),
    (["-r"], {}, ["terminal", "id"]),
], ids=["unknown id", "unknown prefix", "ambiguous prefix", "ambiguous long prefix", "newer format",
        "corrupt middle line", "torn middle line", "empty middle line", "number line", "null line", "list line",
        "string line", "truncate without keep", "set out of range", "truncate to infinity", "tool calls a string",
        "a tool call a number", "a tool call without a function", "no header", "empty file", "session id not a uuid",
        "session id cut short", "session id taken", "continue with a session id", "resume picker without a terminal"])
def test_bad_input_is_one_line_exit_2_nothing_sent_nothing_changed(serve, run, workspace, tmp_path, args, files,
                                                                   fragments):
    server = serve(lambda body: reply("ok"))
    solo = tmp_path / "solo-home"
    env = {"SOLO_HOME": str(solo)}
    for sid in (GOOD, OTHER):
        assert run(["-p", "first", "--session-id", sid], cwd=workspace, base_url=server.url, env=env).code == 0
    for sid, text in files.items():
        (folder(workspace, solo) / f"{sid}.jsonl").write_text(text)
    before, sent = snapshot(solo), len(server.bodies)
    result = run([*args, "-p", "x"], cwd=workspace, base_url=server.url, env=env)
    one_line_error(result, *fragments)
    assert len(server.bodies) == sent and snapshot(solo) == before


def test_continue_with_no_session_here(serve, run, workspace, tmp_path):
    server = serve(lambda body: reply("ok"))
    solo, elsewhere = tmp_path / "solo-home", workspace / "sub"
    elsewhere.mkdir()
    env = {"SOLO_HOME": str(solo)}
    for args in (["-p", "first"], ["-c", "-p", "again"]):  # a session, but not there (and the prune stamp made)
        assert run(args, cwd=workspace, base_url=server.url, env=env).code == 0
    before, sent = snapshot(solo), len(server.bodies)
    for args in (["-c"], ["--continue"], ["-r", next(iter(transcripts(workspace, solo)))]):
        result = run([*args, "-p", "x"], cwd=elsewhere, base_url=server.url, env=env)
        one_line_error(result, "no session", str(elsewhere.resolve()))
    assert len(server.bodies) == sent and snapshot(solo) == before


def test_a_folder_too_deep_for_a_file_name_still_answers_and_resumes(serve, run, workspace):
    """Past ~250 characters the cwd's name cannot be one file name; the run must not die of it."""
    deep = workspace.joinpath(*["a-rather-long-folder-name-" + "x" * 30] * 6)
    deep.mkdir(parents=True)
    server = serve(lambda body: reply(f"answer to {user_turns(body)[-1]}"))
    first = run(["-p", "first"], cwd=deep, base_url=server.url)
    assert (first.code, first.stdout) == (0, "answer to first\n"), first.stderr
    second = run(["-c", "-p", "second"], cwd=deep, base_url=server.url)
    assert (second.code, second.stdout) == (0, "answer to second\n"), second.stderr
    assert user_turns(server.bodies[-1]) == ["first", "second"]


def test_a_solo_home_that_cannot_be_written_does_not_stop_the_run(serve, run, workspace, tmp_path):
    (tmp_path / "a-file").write_text("")
    server = serve(lambda body: reply("still answered"))
    result = run(["-p", "hi"], cwd=workspace, base_url=server.url, env={"SOLO_HOME": str(tmp_path / "a-file" / "solo")})
    assert (result.code, result.stdout) == (0, "still answered\n"), result.stderr
    assert "internal error" not in result.stderr and str(tmp_path / "a-file") in result.stderr  # a warning says so


def test_a_disk_that_fills_mid_run_stops_the_saving_not_the_run(serve, run, workspace):
    """A transcript write that fails (here the file size limit, as a full disk would) once ended the run as an
    internal error, after a part of the line had been written."""
    server = serve(tool_then_answer)
    assert run(["-p", "first"], cwd=workspace, base_url=server.url).code == 0
    [path] = transcripts(workspace).values()
    big = "seq 1 5000"  # a tool result of 24 kB: its line passes the limit
    server.model = tool_then([call("Bash", {"command": big})], "done")
    proc = subprocess.run(["bash", "-c", 'ulimit -f 8; exec "$0" "$@"', str(PROGRAM), "-c", "-p", "go"],
                          cwd=workspace, env=program_env(workspace, server.url), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "done\n"), proc.stderr
    assert proc.stderr.startswith("solo: this session is no longer saved") and proc.stderr.count("\n") == 1
    assert path.stat().st_size <= 8192 and messages_of(path)[-1]["role"] == "assistant"  # whole lines only
    resumed = run(["-c", "-p", "again"], cwd=workspace, base_url=server.url)  # it says so, once (issue 21, item 5)
    assert resumed.code == 0 and resumed.stderr.startswith("solo: this session stopped being saved at "), resumed.stderr
    assert resumed.stderr.count("\n") == 1 and str(path) in resumed.stderr
    assert run(["-c", "-p", "more"], cwd=workspace, base_url=server.url).stderr == ""


@pytest.mark.parametrize("days", ["0", "-3", "a month"])
def test_a_bad_session_days_is_a_usage_error(serve, run, workspace, days):
    server = serve(lambda body: reply("ok"))
    result = run(["-p", "hi"], cwd=workspace, base_url=server.url, env={"SOLO_SESSION_DAYS": days})
    one_line_error(result, "SOLO_SESSION_DAYS")
    assert not server.bodies and not (home_of(workspace) / ".solo").exists()


# --- Pruning -------------------------------------------------------------------------------------------


DAY = 86_400


def aged(path: Path, days: float, text: str = "") -> Path:
    """A file whose last change was `days` ago."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text or transcript_text(path.stem, SYSTEM, FIRST))
    os.utime(path, (time.time() - days * DAY, time.time() - days * DAY))
    return path


@pytest.mark.parametrize("days_env, age, kept", [
    (None, 31, False), (None, 29, True), ("1", 2, False), ("1", 0.5, True), ("45", 40, True), ("0.25", 0.5, False),
])
def test_old_transcripts_are_pruned_at_start_up(serve, run, workspace, tmp_path, days_env, age, kept):
    server = serve(lambda body: reply("ok"))
    solo = tmp_path / "solo-home"
    env = {"SOLO_HOME": str(solo), **({"SOLO_SESSION_DAYS": days_env} if days_env else {})}
    here = aged(folder(workspace, solo) / f"{BAD}.jsonl", age)
    there = aged(solo / "projects" / "-some-other-project" / f"{GOOD}.jsonl", age)  # every project is pruned
    other = aged(solo / "projects" / "-some-other-project" / "notes.txt", 400, "not a transcript")
    result = run(["-p", "hi"], cwd=workspace, base_url=server.url, env=env)
    assert result.code == 0, result.stderr
    assert (here.exists(), there.exists()) == (kept, kept)
    assert other.exists() and len(transcripts(workspace, solo)) == 1 + kept
    assert (solo / "projects" / ".pruned").exists()


def test_pruning_looks_at_most_once_a_day(serve, run, workspace, tmp_path):
    server = serve(lambda body: reply("ok"))
    solo = tmp_path / "solo-home"
    env = {"SOLO_HOME": str(solo)}
    stamp = solo / "projects" / ".pruned"
    first = aged(folder(workspace, solo) / f"{BAD}.jsonl", 31)
    assert run(["-p", "one"], cwd=workspace, base_url=server.url, env=env).code == 0
    assert not first.exists() and stamp.exists()
    second = aged(folder(workspace, solo) / f"{GOOD}.jsonl", 31)
    assert run(["-p", "two"], cwd=workspace, base_url=server.url, env=env).code == 0
    assert second.exists()  # looked less than a day ago
    os.utime(stamp, (time.time() - DAY - 60, time.time() - DAY - 60))
    assert run(["-p", "three"], cwd=workspace, base_url=server.url, env=env).code == 0
    assert not second.exists() and time.time() - stamp.stat().st_mtime < 3600


def test_no_session_persistence_prunes_nothing(serve, run, workspace, tmp_path):
    server = serve(lambda body: reply("ok"))
    solo = tmp_path / "solo-home"
    old = aged(folder(workspace, solo) / f"{BAD}.jsonl", 31)
    before = snapshot(solo)
    result = run(["-p", "hi", "--no-session-persistence"], cwd=workspace, base_url=server.url,
                 env={"SOLO_HOME": str(solo)})
    assert result.code == 0 and old.exists() and snapshot(solo) == before


# --- Forked skills -------------------------------------------------------------------------------------


@pytest.fixture
def fork_workspace(workspace):
    make_skill(workspace, "audit", skill_md("audit", "Audit the project in a separate context",
                                            "FORK-BODY: count files matching $ARGUMENTS", "context: fork\n"))
    return workspace


def fork_by_the_model(body):
    """The main agent calls the Skill tool; the sub-agent and the rest as fork_model."""
    messages = body["messages"]
    if "FORK-BODY" not in messages[1]["content"] and messages[-1]["role"] == "user" and \
            messages[-1]["content"] == "audit please":
        return reply(tool_calls=[call("Skill", {"name": "audit", "arguments": "*.md"})])
    return fork_model(body)


@pytest.mark.parametrize("prompt, model", [("/audit *.py", fork_model), ("audit please", fork_by_the_model)],
                         ids=["by slash", "by the model"])
def test_a_forked_skill_is_a_side_chain_that_resuming_skips(serve, run, fork_workspace, prompt, model):
    server = serve(model)
    first = run(["-p", prompt], cwd=fork_workspace, base_url=server.url)
    assert first.code == 0 and "SUB-ANSWER 7" in first.stdout
    [path] = transcripts(fork_workspace).values()
    side = [e["entry"] for e in entries(path) if e.get("type") == "sidechain"]
    assert [m.get("role") for m in side] == ["system", "user", "assistant", "tool", "assistant"]
    assert "FORK-BODY" in side[1]["content"] and side[-1]["content"] == "SUB-ANSWER 7"
    main = [b for b in server.bodies if "FORK-BODY" not in json.dumps(b["messages"])]
    sent = len(server.bodies)
    assert run(["-c", "-p", "next"], cwd=fork_workspace, base_url=server.url).code == 0
    assert len(server.bodies) == sent + 1
    resumed = server.bodies[-1]["messages"]
    assert "FORK-BODY" not in json.dumps(resumed) and resumed[-1] == {"role": "user", "content": "next"}
    assert resumed[: len(main[-1]["messages"])] == main[-1]["messages"]
    assert server.raw[-1].startswith(server.raw[server.bodies.index(main[-1])][:-2])


# --- Sessions on a terminal ----------------------------------------------------------------------------


@pytest.fixture
def session(terminal, workspace):
    """A session on a terminal with run()'s HOME for its cwd, so both see the same transcripts."""
    def open_one(server, args: list[str] = (), first: str = PROMPT) -> Terminal:
        return terminal(server, *args, env=program_env(workspace, server.url), first=first)
    return open_one


def test_ctrl_c_removes_the_cancelled_turn_from_the_transcript(serve, run, session, workspace):
    server = serve(answers_each_prompt)
    term = session(server)
    term.ask("hello", "answer to hello")
    term.send("slow\r")
    term.expect(r"\[y/n/a/s\] ")
    term.send("y\r")
    shell = wait_for_pid(workspace / "pid")
    term.send("\x03")
    term.expect("cancelled")
    term.expect(PROMPT)
    term.send("\x04")
    assert term.wait() == 0
    kill_group(shell)
    [path] = transcripts(workspace).values()
    assert {"type": "truncate", "keep": 3} in entries(path)
    resumed = run(["-c", "-p", "after"], cwd=workspace, base_url=server.url)
    assert (resumed.code, resumed.stdout) == (0, "answer to after\n"), resumed.stderr
    assert [m.get("content") for m in server.bodies[-1]["messages"][1:]] == ["hello", "answer to hello", "after"]


def test_clear_starts_the_saved_conversation_afresh(serve, run, session, workspace):
    server = serve(lambda body: reply(f"answer to {user_turns(body)[-1]}"))
    term = session(server)
    term.ask("hello", "answer to hello")
    term.ask("/clear", "new conversation")
    term.ask("fresh", "answer to fresh")
    term.send("/exit\r")
    assert term.wait() == 0
    assert run(["-c", "-p", "after"], cwd=workspace, base_url=server.url).code == 0
    assert user_turns(server.bodies[-1]) == ["fresh", "after"]


def test_sessions_lists_and_resume_goes_on_from_the_one_picked(serve, run, session, workspace):
    server = serve(lambda body: reply(f"answer to {user_turns(body)[-1]}"))
    for prompt, sid, hours in (("alpha prompt", GOOD, 2), ("beta prompt", OTHER, 1)):
        assert run(["-p", prompt, "--session-id", sid], cwd=workspace, base_url=server.url).code == 0
        os.utime(transcripts(workspace)[sid], (time.time() - hours * 3600, time.time() - hours * 3600))
    alpha = transcripts(workspace)[GOOD]
    term = session(server)
    [current] = set(transcripts(workspace)) - {GOOD, OTHER}
    term.send("/sessions\r")
    listed = term.expect(PROMPT)
    assert re.search(rf"\* {current[:8]} ", listed)
    assert re.search(r"  5e55e55e  2 h ago, 1 prompt: alpha prompt", listed)
    assert re.search(r"  5e55e55e  1 h ago, 1 prompt: beta prompt", listed)
    assert listed.index("beta prompt") < listed.index("alpha prompt")  # most recent first

    term.send("/resume\r")
    shown = term.expect(r"Resume which \(1-2\)\? ")  # not this session: it has no prompt yet
    number = re.search(r"(\d+)\. 5e55e55e  2 h ago, 1 prompt: alpha prompt", shown).group(1)
    term.send(number + "\r")
    term.expect(rf"resumed {GOOD}: 3 messages")
    term.expect(PROMPT)
    term.ask("more", "answer to more")
    assert user_turns(server.bodies[-1]) == ["alpha prompt", "more"]
    assert header(server.headers[-1], "x-session-id") == GOOD
    assert server.raw[-1].startswith(server.raw[0][:-2])
    term.ask("/model anthropic/claude-haiku-other", "model: anthropic/claude-haiku-other")
    term.send("/exit\r")
    assert term.wait() == 0
    assert {"type": "model", "model": "anthropic/claude-haiku-other"} in entries(alpha)
    assert [m["content"] for m in messages_of(alpha)[1:]] == ["alpha prompt", "answer to alpha prompt", "more",
                                                              "answer to more"]


def test_resume_without_an_id_on_a_terminal_asks_which(serve, session, workspace, run):
    server = serve(lambda body: reply(f"answer to {user_turns(body)[-1]}"))
    for prompt, sid, hours in (("alpha prompt", GOOD, 2), ("beta prompt", OTHER, 1)):
        assert run(["-p", prompt, "--session-id", sid], cwd=workspace, base_url=server.url).code == 0
        os.utime(transcripts(workspace)[sid], (time.time() - hours * 3600, time.time() - hours * 3600))
    term = session(server, ["-r"], first=r"Resume which \(1-2\)\? ")
    assert re.search(r" 1\. 5e55e55e  1 h ago, 1 prompt: beta prompt", term.transcript)
    assert re.search(r" 2\. 5e55e55e  2 h ago, 1 prompt: alpha prompt", term.transcript)
    term.send("2\r")
    term.expect(PROMPT)
    term.ask("more", "answer to more")
    assert user_turns(server.bodies[-1]) == ["alpha prompt", "more"]
    term.send("\x04")
    assert term.wait() == 0
    assert set(transcripts(workspace)) == {GOOD, OTHER}  # went on in alpha's file, made no new one


@pytest.mark.parametrize("key", ["\x03", "\x04", "x\r"], ids=["Ctrl-C", "Ctrl-D", "not a number"])
def test_leaving_the_resume_question_keeps_the_session(serve, run, session, workspace, key):
    server = serve(lambda body: reply(f"answer to {user_turns(body)[-1]}"))
    assert run(["-p", "alpha prompt", "--session-id", GOOD], cwd=workspace, base_url=server.url).code == 0
    term = session(server)
    term.ask("hello", "answer to hello")
    term.send("/resume\r")
    term.expect(r"Resume which \(1-1\)\? ")  # this session is not offered
    term.send(key)
    term.expect(PROMPT)
    term.ask("still here", "answer to still here")
    assert user_turns(server.bodies[-1]) == ["hello", "still here"]
    term.send("/exit\r")
    assert term.wait() == 0


@pytest.mark.parametrize("problem", ["newer format", "open in another solo"])
def test_a_failed_resume_keeps_saving_the_current_session(serve, run, session, workspace, problem):
    server = serve(answers_each_prompt)
    busy = None
    try:
        if problem == "newer format":
            blocked = folder(workspace) / f"{BAD}.jsonl"
            blocked.parent.mkdir(parents=True)
            blocked.write_text(transcript_text(BAD, SYSTEM, FIRST, fmt=99))
        else:
            busy = start(["-p", "slow"], workspace, server.url)
            wait_for_pid(workspace / "pid")
            [sid] = transcripts(workspace)
            blocked = transcripts(workspace)[sid]
        before = blocked.read_bytes()
        term = session(server)
        [current] = set(transcripts(workspace)) - {blocked.stem}
        term.send("/resume\r")
        shown = term.expect(r"Resume which \(1-1\)\? ")  # this session has no prompt yet: not listed
        number = re.search(rf"(\d+)\. {blocked.stem[:8]}", shown).group(1)
        term.send(number + "\r")
        term.expect("newer solo" if problem == "newer format" else "open in another solo")
        term.expect(PROMPT)
        term.ask("hello", "answer to hello")
        assert blocked.read_bytes() == before  # not a line of this session in the other's file
        assert header(server.headers[-1], "x-session-id") == current
        term.send("/exit\r")
        assert term.wait() == 0
        assert [m["content"] for m in messages_of(transcripts(workspace)[current])[1:]] == ["hello", "answer to hello"]
    finally:
        if busy:
            kill_group(wait_for_pid(workspace / "pid"))
            busy.kill()
            busy.wait()


def test_continue_skips_a_session_left_without_a_prompt(serve, run, session, workspace):
    """A session opened and left at once is no conversation: --continue goes on with the last real one."""
    server = serve(lambda body: reply(f"answer to {user_turns(body)[-1]}"))
    assert run(["-p", "first"], cwd=workspace, base_url=server.url).code == 0
    term = session(server)
    term.send("\x04")
    assert term.wait() == 0
    resumed = run(["-c", "-p", "second"], cwd=workspace, base_url=server.url)
    assert resumed.code == 0
    assert user_turns(server.bodies[-1]) == ["first", "second"]


# --- What a crash, a full disk or a hand leaves (issue 21) ---------------------------------------------


def strictly_valid(messages: list[dict]) -> bool:
    """What a strict API checks: each reply's tool calls answered once, in order, right after it; no other results."""
    at = 0
    while at < len(messages):
        message, at = messages[at], at + 1
        if message["role"] == "tool":
            return False
        for call_ in message.get("tool_calls") or []:
            if at == len(messages) or messages[at].get("tool_call_id") != call_["id"]:
                return False
            at += 1
    return True


ASKED = {"role": "user", "content": "the request"}
CALLS = {"role": "assistant", "content": None, "tool_calls": [call("Read", {}, id="a"), call("Read", {}, id="b")]}
RESULT_A, RESULT_B = ({"role": "tool", "tool_call_id": n, "content": n.upper()} for n in "ab")
DONE = {"role": "assistant", "content": "done"}


def test_every_prefix_of_a_compaction_resumes_to_a_conversation_with_the_request(tmp_path):
    """A kill or a full disk between any two of a compaction's lines leaves the old or the new conversation whole;
    it once left `truncate keep=1` alone: a resume with nothing but the system prompt (item 5)."""
    path = tmp_path / f"{GOOD}.jsonl"
    transcript = agent.Transcript(path, KEY)
    transcript.write({"type": "header", "format": 1, "session_id": GOOD})
    messages = agent.Conversation([], transcript)
    for message in ({"role": "system", "content": "s"}, ASKED, CALLS, RESULT_A, RESULT_B, DONE):
        messages.append(message)
    compactor = agent.Compactor(lambda body: reply("THE SUMMARY"), lambda model: {}, lambda event: None)
    assert compactor.compact(agent.Config(api_key=KEY, cwd=tmp_path, context_window=20_000), messages, 100)
    lines = path.read_bytes().splitlines(keepends=True)
    for end in range(3, len(lines) + 1):  # from the request's line on
        resumed, _ = agent.read_transcript(b"".join(lines[:end]), path, print)
        assert strictly_valid(resumed) and "the request" in resumed[1]["content"], lines[end - 1]
    assert resumed == list(messages) and "THE SUMMARY" in resumed[1]["content"]


CORRUPTIONS = {
    "a result twice": ([CALLS, RESULT_A, RESULT_A, RESULT_B], ["A", "B"]),
    "a reply twice": ([CALLS, CALLS, RESULT_A, RESULT_B], ["A", "B"]),
    "results swapped": ([CALLS, RESULT_B, RESULT_A], ["A", "B"]),
    "a result dropped": ([CALLS, RESULT_A], ["A", ERROR_RESULT]),
    "a result before its reply": ([RESULT_A, CALLS, RESULT_B], ["A", "B"]),
    "the reply dropped": ([RESULT_A, RESULT_B], []),
}


@pytest.mark.parametrize("middle, results", CORRUPTIONS.values(), ids=CORRUPTIONS)
def test_a_transcript_put_out_of_order_is_repaired_on_loading(tmp_path, middle, results):
    """Duplicated, swapped, dropped or misplaced lines once gave a request a strict API refuses for good (item 12)."""
    text = transcript_text(BAD, SYSTEM, json.dumps(ASKED), *map(json.dumps, middle), json.dumps(DONE))
    resumed, _ = agent.read_transcript(text.encode(), tmp_path / "x.jsonl", print)
    assert strictly_valid(resumed) and resumed[1] == ASKED and resumed[-1] == DONE
    assert [m["content"] for m in resumed if m["role"] == "tool"] == results


def test_a_set_that_orphans_results_is_repaired_and_the_repair_saved(tmp_path):
    sessions = agent.Sessions(agent.Config(api_key=KEY, cwd=tmp_path, solo_home=tmp_path / "solo"))
    path = sessions.folder / f"{GOOD}.jsonl"
    path.parent.mkdir(parents=True)
    orphaning = {"type": "set", "index": 2, "message": {"role": "assistant", "content": "no calls"}}
    path.write_text(transcript_text(GOOD, SYSTEM, *map(json.dumps, [ASKED, CALLS, RESULT_A, RESULT_B, orphaning])))
    conversation = sessions.open(GOOD, [], print, resume=path)
    assert list(conversation) == [json.loads(SYSTEM), ASKED, orphaning["message"]]
    conversation.transcript.close()
    assert agent.read_transcript(path.read_bytes(), path, print)[0] == list(conversation)
    assert entries(path)[-1] == {"type": "truncate", "keep": 3, "append": []}  # later positions count in the repair


@pytest.mark.parametrize("fork", [False, True], ids=["going on", "forked"])
def test_continue_resume_and_fork_read_bytes_that_are_not_utf8_alike(tmp_path, fork):
    sessions = agent.Sessions(agent.Config(api_key=KEY, cwd=tmp_path, solo_home=tmp_path / "solo"))
    path = sessions.folder / f"{GOOD}.jsonl"
    path.parent.mkdir(parents=True)
    text = transcript_text(GOOD, SYSTEM, FIRST.replace("first", "caf\udce9"))
    path.write_bytes(text.encode("utf-8", "surrogateescape"))  # a lone byte 0xE9: not UTF-8
    conversation = sessions.open(OTHER if fork else GOOD, [], print, resume=path, fork=fork)
    conversation.transcript.close()
    assert conversation[1] == {"role": "user", "content": "caf\ufffd"}


@pytest.mark.parametrize("line", ['{"role": "assistant", "tool_calls": [{"function": {"name": "Read"}}]}',
                                  '{"role": "user", "content": ' + "[" * 100_000 + "]" * 100_000 + "}"],
                         ids=["a tool call without an id", "a line nested too deeply"])
def test_lines_that_were_internal_errors_are_corrupt(tmp_path, line):
    """They once ended the run as an internal error (KeyError, RecursionError): now exit 2, "corrupt" (item 11)."""
    with pytest.raises(agent.UsageError, match="is corrupt"):
        agent.read_transcript(transcript_text(BAD, SYSTEM, FIRST, line).encode(), tmp_path / "x.jsonl", print)


def test_a_transcript_that_vanishes_while_the_folder_is_listed_is_skipped(tmp_path):
    sessions = agent.Sessions(agent.Config(api_key=KEY, cwd=tmp_path, solo_home=tmp_path / "solo"))
    sessions.folder.mkdir(parents=True)
    (sessions.folder / f"{GOOD}.jsonl").write_text(transcript_text(GOOD, SYSTEM, FIRST))
    (sessions.folder / f"{BAD}.jsonl").symlink_to(tmp_path / "deleted.jsonl")  # listed, gone when looked at
    assert sessions.find(None) == sessions.folder / f"{GOOD}.jsonl"


def test_a_crash_in_a_forked_skill_keeps_the_prompt(serve, fork_workspace, tmp_path):
    """The prompt was appended only once the sub-agent returned: a kill -9 in it left no session to continue; here
    the sub-agent's request fails, which leaves the transcript as a kill would (item 7)."""
    server = serve(lambda body: Raw(400, {"error": {"code": 400, "message": "the crash"}})
                   if "FORK-BODY" in body["messages"][1]["content"] else fork_model(body))
    cfg = agent.Config(api_key=KEY, cwd=fork_workspace, base_url=server.url, tools=agent.TOOL_NAMES,
                       solo_home=tmp_path / "solo", session_id=GOOD)
    bot = agent.Agent(cfg, {}, lambda event: None)
    with pytest.raises(agent.ApiError, match="the crash"):
        bot.ask(bot.conversation(), "/audit *.py")
    bot.transcript.close()
    path = agent.Sessions(cfg).find(None)
    assert agent.read_transcript(path.read_bytes(), path, print)[0][1:] == [{"role": "user", "content": "/audit *.py",
                                                                             "prompt_id": 1}]
