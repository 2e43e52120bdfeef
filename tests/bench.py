"""Benchmarks: what the harness costs on top of the model, each figure beside its floor.

Run from the repository root (after tests/setup.sh):  .venv/bin/python tests/bench.py [--quick] [--mcp-only] [--hook-only]
                                                        [--sdk-only] [--acp-only]

Prints a table of medians over several runs: start-up to first request, time per turn over a 200-turn
session (whole replies and streamed), the delay from a streamed chunk to its line on stdout, the time a session
takes to draw a streamed chunk of a 2,000-line Markdown answer (99th percentile), peak RSS idle / reading a 1 GB file / running a command that prints 1 GB, the largest request
body, for prompt caching the share of each request that repeats the previous one byte for byte, and what the
sandbox adds to a trivial command, and what a `true` PreToolUse hook adds to each call (issue 22).
For MCP and parallel calls (issue 15): 4 Greps of ~0.5 s in one reply against the same 4 one after another,
4 read-only MCP calls of 1 s in one reply against the slowest, start-up with one stdio MCP server against
none, and what an MCP call costs over the server's own time. --mcp-only runs just those.
For SDK mode (issue 23): time per turn against -p's, a control round trip, start-up to the initialize answer
against -p's start-up to its first request. --sdk-only runs just those.
For ACP mode (issue 34): time per turn against -p --output-format stream-json's, start-up to the initialize answer
against -p's. --acp-only runs just those.
Not collected by pytest: it takes minutes and its figures depend on the machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fake_openrouter import FakeOpenRouter, Raw, Stream, call, reply, tool_then

ROOT = Path(__file__).resolve().parents[1]
PROGRAM, PYTHON = ROOT / "your_program.sh", ROOT / ".venv" / "bin" / "python"
MCP_SERVER = ROOT / "tests" / "mcp_server.py"
QUICK = "--quick" in sys.argv
MCP_ONLY = "--mcp-only" in sys.argv
SDK_ONLY = "--sdk-only" in sys.argv
ACP_ONLY = "--acp-only" in sys.argv
HOOK_ONLY = "--hook-only" in sys.argv
RUNS = 3 if QUICK else 7

FLOOR_START = """
import requests, sys
requests.post(sys.argv[1] + "/chat/completions", json={"model": "anthropic/claude-haiku-4.5", "messages": []},
              headers={"Authorization": "Bearer bench-key"})
"""

FLOOR_LOOP = """
import json, requests, sys
url, turns, path = sys.argv[1] + "/chat/completions", int(sys.argv[2]), sys.argv[3]
session = requests.Session()
session.headers.update({"Authorization": "Bearer bench-key", "Content-Type": "application/json"})
messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
while True:
    body = {"model": "anthropic/claude-haiku-4.5", "messages": messages}
    message = session.post(url, data=json.dumps(body)).json()["choices"][0]["message"]
    messages.append(message)
    if not message.get("tool_calls"):
        break
    for c in message["tool_calls"]:
        with open(path) as f:
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": f.read()})
"""


def env_for(server: FakeOpenRouter, workspace: Path) -> dict:
    return {**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "bench-key", "HOME": str(workspace)}


def peak_rss(args: list[str], server: FakeOpenRouter, workspace: Path) -> int:
    """Run a command to its end, polling its peak resident memory (VmHWM); return it in MB."""
    proc = subprocess.Popen(args, cwd=workspace, env=env_for(server, workspace), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            peak = max(peak, int(status.split("VmHWM:")[1].split()[0]))
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.005)
    if proc.returncode != 0:
        raise SystemExit(f"{args[0]} failed with {proc.returncode}")
    return peak // 1024


def startup(workspace: Path) -> tuple[float, float]:
    """Median seconds from spawn to first request: the agent, and a bare requests.post script, interleaved."""
    commands = {"agent": lambda url: [str(PROGRAM), "-p", "hi"], "floor": lambda url: [str(PYTHON), "-c", FLOOR_START, url]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    with FakeOpenRouter(lambda body: reply("ok"), validate=False) as server:
        for run in range(3 * RUNS + 1):  # the first round only warms the caches
            for name, command in commands.items():
                seen, start = len(server.times), time.monotonic()
                subprocess.run(command(server.url), cwd=workspace, env=env_for(server, workspace), check=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
                if run:
                    times[name].append(server.times[seen] - start)
    return statistics.median(times["agent"]), statistics.median(times["floor"])


def session_model(turns: int):
    """A model that reads a small file `turns` times, one call per turn, then answers."""
    def model(body):
        done = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return reply(tool_calls=[call("Read", {"file_path": "small.txt"})]) if done < turns else reply("done")
    return model


def per_turn(workspace: Path, turns: int = 200) -> tuple[dict[str, float], int]:
    """Median seconds per turn: the agent streaming (as by default), the agent with whole replies, and the
    minimal non-streamed requests loop; and the largest agent body in bytes."""
    (workspace / "small.txt").write_text("a small file\n" * 5)
    commands = {"streamed": [str(PROGRAM), "-p", "go"], "whole": [str(PROGRAM), "-p", "go", "--no-stream"],
                "floor": [str(PYTHON), "-c", FLOOR_LOOP, "URL", str(turns), "small.txt"]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    largest = 0
    for _ in range(max(3, RUNS // 2)):
        for name, command in commands.items():
            with FakeOpenRouter(session_model(turns), validate=False) as server:
                subprocess.run([server.url if arg == "URL" else arg for arg in command], cwd=workspace, check=True,
                               env=env_for(server, workspace), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
                times[name].append((server.times[-1] - server.times[0]) / turns)
                largest = max(largest, max(len(r) for r in server.raw)) if name != "floor" else largest
    return {name: statistics.median(values) for name, values in times.items()}, largest


def text_delta(line: bytes) -> str | None:
    """The text of a stream_event line's text delta; None for any other line (message_start,
    content_block_start and the rest, api_retry, the assistant and result lines)."""
    if b'"text_delta"' not in line:
        return None
    event = json.loads(line).get("event") or {}
    delta = event.get("delta") or {}
    is_text = event.get("type") == "content_block_delta" and delta.get("type") == "text_delta"
    return delta.get("text") if is_text else None


def chunk_delays(workspace: Path, chunks: int = 60, *, break_after: int | None = None) -> list[float]:
    """Seconds from each text chunk leaving the server to its text delta's stream_event line on the agent's
    stdout. Each chunk's text is its own, so a line is matched to the chunk that carried it. A stream that breaks
    and is retried sends its chunks again (after a backoff of at least half a second, long after the first
    attempt's lines were read): a line is matched to the latest sending of its text. `break_after` breaks the
    first stream after that many chunks, as a loaded machine may (the test of this function)."""
    sent: dict[str, float] = {}
    events: list = []
    for i in range(chunks):
        events += [0.01, lambda text=f"{i} ": sent.__setitem__(text, time.monotonic()),
                   {"choices": [{"index": 0, "delta": {"content": f"{i} "}}]}]
    events += [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, "data: [DONE]\n\n"]
    delays = []
    broken = [Stream(events[:3 * break_after], drop=True)] if break_after is not None else []
    with FakeOpenRouter(lambda body: broken.pop() if broken else Stream(list(events)), validate=False) as server:
        proc = subprocess.Popen([str(PROGRAM), "-p", "go", "--output-format", "stream-json", "--include-partial-messages"],
                                cwd=workspace, env=env_for(server, workspace), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, bufsize=0)
        for line in proc.stdout:
            if (text := text_delta(line)) in sent:
                delays.append(time.monotonic() - sent[text])
        proc.wait()
    if proc.returncode != 0 or not delays:
        raise SystemExit(f"stream-json run failed with {proc.returncode} after {len(delays)} text chunks")
    return delays


def chunk_to_stdout(workspace: Path) -> float:
    """Median seconds from a text chunk leaving the server to its line on the agent's stdout."""
    return statistics.median(chunk_delays(workspace))


MARKDOWN_BLOCK = ("## Step {i}\nSome **bold** text with `code` and *emphasis*, then a list:\n- item one\n- item two\n"
                  "```python\ndef f(x):  # a comment\n    return 'value'\n```\n| name | value |\n|---|--:|\n"
                  "| a | 22 |\n| 名前 | 👍 |\n> a quote\nA paragraph long enough to wrap at eighty columns — with [a link]"
                  "(https://example.com/docs/step-{i}) and “words”, so that every line of it is wrapped at words when "
                  "it is complete.\n"
                  "- a list item that wraps as well, its second row hanging under the text of the item itself\n")


def markdown_chunk(lines: int = 2000) -> tuple[float, float, float]:
    """The 99th percentile of the time a session takes to draw one streamed chunk of a 2,000-line Markdown answer
    on a terminal 80 columns wide (sanitised, the unfinished line shown plain, a complete one drawn and wrapped, the
    status line redrawn), in chunks of 1 to 40 characters as models stream them; and the same for the first and the
    last quarter of the chunks, which must not differ: a chunk costs the same however long the answer has grown."""
    import io
    import random
    from app import main as agent

    class Screen(io.StringIO):
        def isatty(self) -> bool:
            return True

    text = "\n".join("".join(MARKDOWN_BLOCK.format(i=i) for i in range(lines // 16 + 1)).split("\n")[:lines])
    display = agent.Display(agent.Config(api_key="k", cwd=Path.cwd()), agent.Streams(None, Screen(), Screen()),
                            {"TERM": "xterm"})
    display.working("thinking")
    times, at, sizes = [], 0, random.Random(2000)
    while at < len(text):
        piece = text[at:at + sizes.randint(1, 40)]
        at += len(piece)
        began = time.perf_counter()
        display.delta({"content": piece})
        times.append(time.perf_counter() - began)
    quarter = len(times) // 4
    return tuple(statistics.quantiles(part, n=100)[98] for part in (times, times[:quarter], times[-quarter:]))


def memory(workspace: Path) -> dict[str, tuple[int, int]]:
    """Peak RSS in MB (and the largest request body) idle, reading a 1 GB file, and a command printing 1 GB."""
    big = workspace / "big.txt"
    if not big.exists() or big.stat().st_size < 1 << 30:
        line = b"the quick brown fox jumps over the lazy dog 0123456789\n" * 1000
        with open(big, "wb") as f:
            f.writelines(line for _ in range((1 << 30) // len(line) + 1))
    cases = {"idle (answer at once)": lambda body: reply("ok"),
             "Read of a 1 GB file": tool_then([call("Read", {"file_path": "big.txt"})], "done"),
             "Bash printing 1 GB": tool_then([call("Bash", {"command": "yes | head -c 1073741824"})], "done")}
    results = {}
    for label, model in cases.items():
        peaks, largest = [], 0
        for _ in range(max(2, RUNS // 3)):
            with FakeOpenRouter(model, validate=False) as server:
                peaks.append(peak_rss([str(PROGRAM), "-p", "go"], server, workspace))
                largest = max(largest, max(len(r) for r in server.raw))
        results[label] = (statistics.median(peaks), largest)
    return results


def prefix_share(workspace: Path, turns: int = 30) -> tuple[float, int]:
    """For a 30-turn session: mean share of each request (turns 2-30) that repeats the previous one; bytes sent."""
    with FakeOpenRouter(session_model(turns - 1), validate=False) as server:
        subprocess.run([str(PROGRAM), "-p", "go", "--max-turns", "1000"], cwd=workspace, env=env_for(server, workspace), check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        raw = list(server.raw)
    shares = [len(os.path.commonprefix([before, after])) / len(after) for before, after in zip(raw, raw[1:])]
    return statistics.mean(shares), sum(len(r) for r in raw)


def long_session(workspace: Path, turns: int = 400, window: int = 20_000) -> dict[str, dict]:
    """A 400-turn session against a server that enforces a 20,000-token window (tokens counted as bytes / 4),
    with compaction on and off: the outcome, compactions, peak prompt and tokens sent in all."""
    files = workspace / "notes"
    files.mkdir(exist_ok=True)
    for i in range(turns):
        (files / f"{i}.txt").write_text(f"note {i}: " + "lorem ipsum dolor sit amet " * 60 + "\n")
    results = {}
    for label, extra in (("compaction on", {}), ("compaction off", {"SOLO_COMPACT_AT": "1"})):
        done = {"turns": 0, "summaries": 0, "peak": 0, "sent": 0}

        def model(body: dict) -> object:
            tokens = len(json.dumps(body)) // 4
            done["sent"] += tokens
            if tokens > window:
                return Raw(400, {"error": {"code": 400, "message": f"This endpoint's maximum context length is {window} "
                                           f"tokens. However, you requested {tokens} tokens."}})
            done["peak"] = max(done["peak"], tokens)
            usage = {"prompt_tokens": tokens, "completion_tokens": 20, "total_tokens": tokens + 20, "cost": 0.0}
            if "tools" not in body:
                done["summaries"] += 1
                return reply(f"Summary: read notes 0 to {done['turns'] - 1} so far; keep reading.", usage=usage)
            done["turns"] += 1
            if done["turns"] > turns:
                return reply("all notes read", usage=usage)
            return reply(tool_calls=[call("Read", {"file_path": f"notes/{done['turns'] - 1}.txt"})], usage=usage)

        with FakeOpenRouter(model, validate=False) as server:
            proc = subprocess.run([str(PROGRAM), "-p", "read every note"], cwd=workspace, capture_output=True, text=True,
                                  env={**env_for(server, workspace), **extra}, stdin=subprocess.DEVNULL)
        outcome = proc.stdout.strip() or f"failed ({proc.stderr.strip().splitlines()[-1][:110]})"
        results[label] = {**done, "outcome": outcome}
    return results


def sandbox_cost(workspace: Path, runs: int = 100 if QUICK else 400) -> tuple[float, float] | None:
    """Median seconds of a trivial Bash call through tool_bash, unconfined and confined (each started by its
    zygote, as the agent does), interleaved; None when this kernel has no Landlock."""
    from app import main as agent
    spawner = agent.Spawner()
    plain = agent.ToolContext(cwd=workspace, env=agent.command_env(dict(os.environ)), spawner=spawner,
                              zygote=agent.unconfined_zygote(spawner))
    roots = (workspace.resolve(), Path(tempfile.gettempdir()).resolve())
    protection = agent.protection((workspace.resolve(),), roots, dict(os.environ), None)  # read-only, as the agent's
    try:
        sandbox, _ = agent.make_sandbox("workspace-write", roots, False, read_only=protection.paths)
    except agent.UsageError:
        protection.remove()
        return None
    confined = plain._replace(sandbox=sandbox)
    times: dict[str, list[float]] = {"plain": [], "confined": []}
    try:
        for i in range(2 * runs + 20):  # the first 20 only warm up
            name, ctx = ("plain", plain) if i % 2 else ("confined", confined)
            started = time.perf_counter()
            result = agent.tool_bash(ctx, "true")
            if i >= 20:
                times[name].append(time.perf_counter() - started)
            assert result == "(no output)\n[exit code 0]", result
    finally:
        plain.zygote.stop()
        sandbox.spawner.shutdown()
        protection.remove()
    return statistics.median(times["plain"]), statistics.median(times["confined"])


def hook_cost(workspace: Path, turns: int = 100) -> tuple[float, float, float]:
    """Median seconds per turn (one Read each) with a `true` PreToolUse hook on every call and without, and what
    starting the hook's process costs by itself (`setpriv --pdeathsig KILL /bin/sh -c true` from this small process:
    a floor; solo forks it from its zygote)."""
    (workspace / "small.txt").write_text("a small file\n" * 5)
    hooked = workspace / "hooked-home"
    (hooked / ".claude").mkdir(parents=True, exist_ok=True)
    hook = {"type": "command", "command": "true"}
    (hooked / ".claude" / "settings.json").write_text(json.dumps({"hooks": {"PreToolUse": [{"hooks": [hook]}]}}))
    times: dict[str, list[float]] = {"hooked": [], "plain": []}
    for _ in range(max(3, RUNS // 2)):
        for name, home in (("hooked", hooked), ("plain", workspace)):
            with FakeOpenRouter(session_model(turns), validate=False) as server:
                subprocess.run([str(PROGRAM), "-p", "go", "--no-stream"], cwd=workspace, check=True,
                               env={**env_for(server, workspace), "HOME": str(home)}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL)
                times[name].append((server.times[-1] - server.times[0]) / turns)
    setpriv = ["/usr/bin/setpriv", "--pdeathsig", "KILL"] if os.access("/usr/bin/setpriv", os.X_OK) else []
    started = time.monotonic()
    for _ in range(100):  # the floor: a small process starts the hook's process
        subprocess.run([*setpriv, "/bin/sh", "-c", "true"], input=b"{}", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return statistics.median(times["hooked"]), statistics.median(times["plain"]), (time.monotonic() - started) / 100


def mcp_config(*options: str) -> str:
    """--mcp-config for one test server `t` with these options."""
    return json.dumps({"mcpServers": {"t": {"command": str(PYTHON), "args": [str(MCP_SERVER), *options]}}})


def traced_results(model, workspace: Path, *flags: str) -> list[dict]:
    """Run the program on a model script with a trace; its tool_result events (each with `seconds`, counted from
    the start of the call's batch)."""
    trace = workspace / "trace.jsonl"
    trace.unlink(missing_ok=True)
    with FakeOpenRouter(model, validate=False) as server:
        subprocess.run([str(PROGRAM), "-p", "go", "--trace", str(trace), *flags], cwd=workspace, check=True,
                       env=env_for(server, workspace), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    return [event for event in events if event["type"] == "tool_result"]


def one_per_turn(calls: list) -> object:
    """A model that makes these calls one per turn, then answers."""
    def model(body):
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        return reply(tool_calls=[calls[done]]) if done < len(calls) else reply("done")
    return model


def grep_tree(workspace: Path, seconds: float = 0.5) -> Path:
    """A folder of text files that one Grep for an absent word takes about `seconds` to search."""
    from app import main as agent
    tree = workspace / "tree"
    tree.mkdir(exist_ok=True)
    line = "the quick brown fox jumps over the lazy dog 0123456789\n" * 200
    ctx = agent.ToolContext(cwd=workspace, env={})
    count = 20
    while True:
        for i in range(len(list(tree.iterdir())), count):
            (tree / f"{i}.txt").write_text(line)
        start = time.monotonic()
        agent.tool_grep(ctx, "absent0", path="tree")
        took = time.monotonic() - start
        if took >= seconds * 0.9 or count > 20_000:
            return tree
        count = int(count * min(4.0, seconds / max(took, 1e-3)) * 1.05) + 1


def parallel_greps(workspace: Path) -> tuple[float, float]:
    """Median seconds for 4 Greps of ~0.5 s: all in one reply (the batch's wall time), and one per turn (the sum)."""
    grep_tree(workspace)
    calls = [call("Grep", {"pattern": f"absent{i}", "path": "tree"}) for i in range(4)]
    together, apart = [], []
    for _ in range(RUNS):
        together.append(max(r["seconds"] for r in traced_results(tool_then(calls, "done"), workspace)))
        apart.append(sum(r["seconds"] for r in traced_results(one_per_turn(calls), workspace)))
    return statistics.median(together), statistics.median(apart)


def parallel_mcp(workspace: Path) -> float:
    """Median wall seconds of one reply with 4 read-only MCP calls that each wait 1 s."""
    calls = [call("mcp__t__sleep", {"seconds": 1, "tag": str(i)}) for i in range(4)]
    walls = [max(r["seconds"] for r in traced_results(tool_then(calls, "done"), workspace, "--mcp-config",
                                                      mcp_config("--only", "sleep")))
             for _ in range(RUNS)]
    return statistics.median(walls)


def mcp_startup(workspace: Path) -> tuple[float, float]:
    """Median seconds from spawn to first request with one stdio MCP server configured, and with none."""
    config = mcp_config("--only", "echo")
    times: dict[str, list[float]] = {"mcp": [], "none": []}
    with FakeOpenRouter(lambda body: reply("ok"), validate=False) as server:
        for run in range(3 * RUNS + 1):  # the first round only warms the caches
            for name, extra in (("mcp", ["--mcp-config", config]), ("none", [])):
                seen, start = len(server.times), time.monotonic()
                subprocess.run([str(PROGRAM), "-p", "hi", *extra], cwd=workspace, env=env_for(server, workspace),
                               check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
                if run:
                    times[name].append(server.times[seen] - start)
    return statistics.median(times["mcp"]), statistics.median(times["none"])


def mcp_overhead(workspace: Path, calls: int = 100) -> tuple[float, float]:
    """Median seconds an MCP call takes in the agent beyond the server's own time (from reading the request to
    writing the answer), over one reply of `calls` calls that run one after another; and that server time."""
    results = traced_results(tool_then([call("mcp__t__stamp", {}) for _ in range(calls)], "done"), workspace,
                             "--mcp-config", mcp_config("--only", "stamp"))
    own = [json.loads(r["content"])["server_seconds"] for r in results]
    return statistics.median(r["seconds"] - o for r, o in zip(results, own)), statistics.median(own)


def mcp_rows(workspace: Path) -> list[tuple[str, str, str, str]]:
    """The MCP and parallel-call rows of the table."""
    together, apart = parallel_greps(workspace)
    wall = parallel_mcp(workspace)
    with_mcp, without = mcp_startup(workspace)
    overhead, own = mcp_overhead(workspace)
    return [
        ("4 Greps of ~0.5 s in one reply", f"{together * 1000:.0f} ms", f"{apart * 1000:.0f} ms apart",
         f"{together / apart * 100:.0f}% (target <= 75%)"),
        ("4 MCP calls of 1 s in one reply", f"{wall * 1000:.0f} ms", "1000 ms slowest", f"{wall:.2f}x (target <= 1.5x)"),
        ("start-up with one MCP server", f"{with_mcp * 1000:.0f} ms", f"{without * 1000:.0f} ms none",
         f"+{(with_mcp - without) * 1000:.0f} ms"),
        ("MCP call over the server's time", f"{overhead * 1000:.2f} ms", f"{own * 1000:.2f} ms own",
         "median (target <= 2 ms)"),
    ]


SDK_ARGS = ["--output-format", "stream-json", "--verbose", "--system-prompt", "", "--permission-mode",
            "bypassPermissions", "--input-format", "stream-json"]  # as the Agent SDK starts its CLI


class SdkDriver:
    """solo in SDK mode, driven line by line as the Agent SDK drives it (without the SDK's own costs)."""

    def __init__(self, server: FakeOpenRouter, workspace: Path):
        self.proc = subprocess.Popen([str(PROGRAM), *SDK_ARGS], cwd=workspace, env=env_for(server, workspace),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
        self.ids = 0

    def send(self, obj: dict) -> None:
        self.proc.stdin.write(json.dumps(obj).encode() + b"\n")

    def until(self, kind: str) -> dict:
        """Read lines up to the first of this type."""
        for line in self.proc.stdout:
            if (obj := json.loads(line))["type"] == kind:
                return obj
        raise SystemExit(f"solo ended before a {kind} line")

    def control(self, subtype: str, **fields) -> dict:
        self.ids += 1
        self.send({"type": "control_request", "request_id": f"req_{self.ids}", "request": {"subtype": subtype, **fields}})
        return self.until("control_response")

    def start(self) -> None:
        self.control("initialize", hooks=None)

    def go(self, text: str) -> dict:
        self.send({"type": "user", "message": {"role": "user", "content": text}, "parent_tool_use_id": None,
                   "session_id": "default"})
        return self.until("result")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def mode_rows(mode: str, driver: Callable, workspace: Path, turns: int = 200) -> list[tuple[str, str, str, str]]:
    """A protocol mode's time per model turn against -p --output-format stream-json's, and its start-up to the
    initialize answer against -p's start-up to its first request (`driver(server)` starts it)."""
    (workspace / "small.txt").write_text("a small file\n" * 5)
    per_turn: dict[str, list[float]] = {mode: [], "p": []}
    for _ in range(max(3, RUNS // 2)):
        for name in per_turn:
            with FakeOpenRouter(session_model(turns), validate=False) as server:
                if name == mode:
                    (one := driver(server)).start()
                    one.go("go")
                    one.close()
                else:
                    subprocess.run([str(PROGRAM), "-p", "go", "--output-format", "stream-json", "--verbose"],
                                   cwd=workspace, env=env_for(server, workspace), check=True,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                per_turn[name].append((server.times[-1] - server.times[0]) / turns)
    starts = []
    with FakeOpenRouter(lambda body: reply("ok"), validate=False) as server:
        for run in range(3 * RUNS + 1):  # the first only warms the caches
            started = time.monotonic()
            (one := driver(server)).start()
            if run:
                starts.append(time.monotonic() - started)
            one.close()
    start_p = startup(workspace)[0]
    ours, p, start = statistics.median(per_turn[mode]), statistics.median(per_turn["p"]), statistics.median(starts)
    return [(f"{mode} mode: time per turn, {turns} turns", f"{ours * 1000:.2f} ms", f"{p * 1000:.2f} ms -p",
             f"{ours / p:.2f}x (target <= 1.5x)"),
            (f"{mode} mode: start-up to initialize answer", f"{start * 1000:.0f} ms", f"{start_p * 1000:.0f} ms -p",
             f"{start / start_p:.2f}x (target <= 1.3x)")]


def sdk_rows(workspace: Path) -> list[tuple[str, str, str, str]]:
    """SDK mode: time per model turn and start-up against -p's, a control round trip, one prompt answered."""
    trips, prompts = [], []
    with FakeOpenRouter(lambda body: reply("ok"), validate=False) as server:
        (driver := SdkDriver(server, workspace)).start()
        for _ in range(200):
            started = time.perf_counter()
            driver.control("mcp_status")
            trips.append(time.perf_counter() - started)
        for _ in range(20):
            started = time.perf_counter()
            driver.go("hi")
            prompts.append(time.perf_counter() - started)
        driver.close()
    turn, start = mode_rows("SDK", lambda server: SdkDriver(server, workspace), workspace)
    return [turn, ("SDK mode: one prompt answered", f"{statistics.median(prompts) * 1000:.1f} ms", "",
                   "prompt to result"),
            ("SDK mode: control round trip", f"{statistics.median(trips) * 1000:.2f} ms", "", "median (target <= 5 ms)"),
            start]


class AcpDriver:
    """solo --acp, driven line by line as an editor drives it (JSON-RPC; every update read, none kept)."""

    def __init__(self, server: FakeOpenRouter, workspace: Path):
        self.proc = subprocess.Popen([str(PROGRAM), "--acp", "--yes"], cwd=workspace, env=env_for(server, workspace),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
        self.ids, self.workspace = 0, workspace

    def call(self, method: str, **params) -> dict:
        """A request and its answer (the updates before it read and dropped)."""
        self.ids += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.ids, "method": method,
                                          "params": params}).encode() + b"\n")
        for line in self.proc.stdout:
            if (obj := json.loads(line)).get("id") == self.ids and "method" not in obj:
                return obj
        raise SystemExit(f"solo ended before answering {method}")

    def start(self) -> None:
        self.call("initialize", protocolVersion=1, clientCapabilities={})

    def go(self, text: str) -> dict:
        """One prompt in a new session, answered."""
        session = self.call("session/new", cwd=str(self.workspace), mcpServers=[])["result"]["sessionId"]
        return self.call("session/prompt", sessionId=session, prompt=[{"type": "text", "text": text}])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def acp_rows(workspace: Path) -> list[tuple[str, str, str, str]]:
    """ACP mode (issue 34): time per model turn and start-up against -p's."""
    return mode_rows("ACP", lambda server: AcpDriver(server, workspace), workspace)


def print_rows(rows: list[tuple[str, str, str, str]]) -> None:
    print(f"{'measure':36} {'solo':>12} {'floor':>16}  verdict")
    for name, value, floor, verdict in rows:
        print(f"{name:36} {value:>12} {floor:>16}  {verdict}")


def main() -> None:
    """Run every benchmark and print the table."""
    subprocess.run([str(PROGRAM), "--version"], check=True, stdout=subprocess.DEVNULL)  # set-up outside timings
    if HOOK_ONLY:
        with tempfile.TemporaryDirectory(prefix="solo-bench-") as tmp:
            hooked, plain, shell = hook_cost(Path(tmp))
            print(f"PreToolUse hook `true` on every call: {hooked * 1000:.2f} ms a turn against {plain * 1000:.2f} ms "
                  f"(+{(hooked - plain) * 1000:.2f} ms); its process alone {shell * 1000:.2f} ms")
        return
    if MCP_ONLY:
        with tempfile.TemporaryDirectory(prefix="solo-bench-") as tmp:
            print_rows(mcp_rows(Path(tmp)))
        return
    if SDK_ONLY:
        with tempfile.TemporaryDirectory(prefix="solo-bench-") as tmp:
            print_rows(sdk_rows(Path(tmp)))
        return
    if ACP_ONLY:
        with tempfile.TemporaryDirectory(prefix="solo-bench-") as tmp:
            print_rows(acp_rows(Path(tmp)))
        return
    with tempfile.TemporaryDirectory(prefix="solo-bench-") as tmp:
        workspace = Path(tmp)
        sandbox = sandbox_cost(workspace)
        mcp = mcp_rows(workspace)
        sdk = sdk_rows(workspace)
        acp = acp_rows(workspace)
        start_agent, start_floor = startup(workspace)
        turns, largest = per_turn(workspace)
        delay = chunk_to_stdout(workspace)
        peaks = memory(workspace)
        share, sent = prefix_share(workspace)
        long = long_session(workspace)
        hooked, plain, shell = hook_cost(workspace)
        chunk = markdown_chunk()
    idle = peaks["idle (answer at once)"][0]
    rows = [
        ("start-up to first request", f"{start_agent * 1000:.0f} ms", f"{start_floor * 1000:.0f} ms",
         f"{start_agent / start_floor:.2f}x (target <= 1.2x)"),
        ("time per turn, 200 turns, whole replies", f"{turns['whole'] * 1000:.2f} ms", f"{turns['floor'] * 1000:.2f} ms",
         f"{turns['whole'] / turns['floor']:.2f}x (target <= 1.3x)"),
        ("time per turn, 200 turns, streamed", f"{turns['streamed'] * 1000:.2f} ms", f"{turns['floor'] * 1000:.2f} ms",
         f"{turns['streamed'] / turns['floor']:.2f}x (target <= 1.5x)"),
        ("stream-json: chunk to stdout", f"{delay * 1000:.2f} ms", "", "median (target <= 5 ms)"),
        ("session: draw a Markdown chunk, p99", f"{chunk[0] * 1000:.3f} ms", "",
         f"2,000-line answer; first/last quarter {chunk[1] * 1000:.3f}/{chunk[2] * 1000:.3f} ms (target < 1 ms)"),
        *[(f"peak RSS, {label}", f"{mb} MB", f"{idle} MB idle", f"+{mb - idle} MB (target <= +30 MB)")
          for label, (mb, _) in peaks.items()],
        ("largest request body", f"{max([largest] + [b for _, b in peaks.values()]) / 1000:.0f} kB", "", ""),
        ("30-turn session: prefix repeated", f"{share * 100:.1f}%", "", "target >= 95%"),
        ("30-turn session: bytes sent", f"{sent / 1000:.0f} kB", "", ""),
        ("Bash `true` via tool_bash, sandboxed", *((f"{sandbox[1] * 1000:.2f} ms", f"{sandbox[0] * 1000:.2f} ms",
          f"{(sandbox[1] - sandbox[0]) * 1000:+.2f} ms set-up (target <= 5 ms)") if sandbox else
          ("n/a", "", "this kernel has no Landlock"))),
        ("PreToolUse hook `true` on every call", f"+{(hooked - plain) * 1000:.2f} ms a call",
         f"{shell * 1000:.2f} ms its process alone", f"{(hooked - plain) / shell:.2f}x its process"),
    ]
    print_rows(rows + mcp + sdk + acp)
    print("\n400-turn session in a 20,000-token window:")
    for label, result in long.items():
        print(f"  {label}: {result['outcome']!r} after {result['turns']} turns; {result['summaries']} compactions, "
              f"peak prompt {result['peak']} tokens, {result['sent'] / 1e6:.2f} M tokens sent")


if __name__ == "__main__":
    main()
