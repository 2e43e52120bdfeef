"""A stdio MCP server for tests and benchmarks (stdlib only): JSON-RPC messages, one per line, on stdin/stdout.

    python tests/mcp_server.py [options]

Tools (all of them unless --only names some):
    echo      {text}            "echo: TEXT"; changes things (no readOnlyHint)
    peek      {text}            "peek: TEXT"; read-only; its inputSchema has no "type"
    bare      (no inputSchema)  its arguments as JSON; only a title, no description
    args      {count, tags, opts, ...}   the arguments it got, as JSON (additionalProperties allowed)
    sleep     {seconds, tag}    waits, then "slept SECONDS TAG"; read-only (calls run in threads, at once)
    fail      {}                an isError result "it went wrong"; read-only
    huge      {size}            a text of `size` characters: HEAD, x..., TAIL; read-only
    parts     {}                text, image, audio, resource (text and blob) and resource_link parts; read-only
    struct    {with_text}       structuredContent, with a text part only when with_text; read-only
    blank     {}                three text parts, the middle one empty; read-only
    rpc_error {}                a JSON-RPC error answer instead of a result
    crash     {}                the server exits while the call is pending
    stamp     {}                {"server_seconds": time from reading the request to writing the answer}

Options:
    --only NAMES        comma-separated tools to offer
    --tool NAME         one more echo-like tool with this exact name ("NAME: TEXT"); repeatable
    --page N            tools/list answers N tools a page, with nextCursor
    --init-delay S      sleep S seconds before answering initialize
    --exit-at-start N   exit with code N before reading anything
    --record FILE       append JSON lines: start (argv, env, pid, pgid, sid, cwd), every message received, the
                        client's answers to the server's own requests
    --pidfile FILE      write "PID CHILD_PID" (the child: a `sleep` in the server's process group)
    --child KIND        plain (default), stubborn (the child ignores SIGTERM) or holding (it shares the server's
                        stdout and stderr, so they stay open after the server exits)
    --ask-client        before answering the first tools/list: send ping, roots/list and an unsupported request
                        to the client, wait for the three answers (recorded), and send a log notification
    --stderr TEXT       write TEXT to stderr at start and at every call
    --stdout-noise      print a line that is not JSON on stdout before anything else
    --odd-tools         tools/list also holds malformed entries (annotations, schema, name of the wrong types)
    --endless-pages     every tools/list page says there is a next one
    --tools-not-a-list  tools/list answers {"tools": 5}
    --ignore-term       ignore SIGTERM and go on living when stdin ends (only SIGKILL ends it)
    --stop-reading      after answering the first tools/list, never read stdin again (and live on)
    --deep-line         before anything else, print a line of JSON nested 100,000 levels deep
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time

PROTOCOL = "2025-06-18"
WRITING = threading.Lock()
RECORDING = threading.Lock()


def options(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="")
    parser.add_argument("--tool", action="append", default=[])
    parser.add_argument("--page", type=int, default=0)
    parser.add_argument("--init-delay", type=float, default=0)
    parser.add_argument("--exit-at-start", type=int)
    parser.add_argument("--record")
    parser.add_argument("--pidfile")
    parser.add_argument("--child", choices=("plain", "stubborn", "holding"), default="plain")
    parser.add_argument("--ask-client", action="store_true")
    parser.add_argument("--stderr", default="")
    parser.add_argument("--stdout-noise", action="store_true")
    parser.add_argument("--odd-tools", action="store_true")
    parser.add_argument("--endless-pages", action="store_true")
    parser.add_argument("--tools-not-a-list", action="store_true")
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--stop-reading", action="store_true")
    parser.add_argument("--deep-line", action="store_true")
    return parser.parse_args(argv)


OPTS = options(sys.argv[1:])


def record(**entry) -> None:
    """One JSON line in the record file, written whole."""
    if OPTS.record:
        with RECORDING, open(OPTS.record, "a") as f:
            f.write(json.dumps(entry) + "\n")


def write(message: dict) -> None:
    """One message on stdout."""
    with WRITING:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def noise() -> None:
    if OPTS.stderr:
        sys.stderr.write(OPTS.stderr + "\n")
        sys.stderr.flush()


def text(value: str) -> dict:
    return {"content": [{"type": "text", "text": value}]}


def schema(required: list[str] | None = None, **props: str) -> dict:
    return {"type": "object", "properties": {name: {"type": kind} for name, kind in props.items()},
            "required": required or []}


READ_ONLY = {"readOnlyHint": True, "destructiveHint": False}
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 24).decode()
WAV = base64.b64encode(b"RIFF" + b"\0" * 40).decode()


def sleep(args: dict) -> dict:
    time.sleep(float(args.get("seconds", 1)))
    return text(f"slept {args.get('seconds', 1)} {args.get('tag', '')}".rstrip())


def huge(args: dict) -> dict:
    size = int(args.get("size", 100_000))
    return text("HEAD" + "x" * max(0, size - 8) + "TAIL")


def parts(args: dict) -> dict:
    return {"content": [
        {"type": "text", "text": "caption"},
        {"type": "image", "data": PNG, "mimeType": "image/png"},
        {"type": "audio", "data": WAV, "mimeType": "audio/wav"},
        {"type": "resource", "resource": {"uri": "file:///notes.txt", "mimeType": "text/plain", "text": "inside the resource"}},
        {"type": "resource", "resource": {"uri": "file:///blob.bin", "mimeType": "application/octet-stream", "blob": "AAECAw=="}},
        {"type": "resource_link", "uri": "file:///linked.txt", "name": "linked.txt"},
    ]}


def struct(args: dict) -> dict:
    data = {"temperature": 21.5, "unit": "C", "tags": ["dry", "sunny"]}
    return {"content": [{"type": "text", "text": "21.5 C"}] if args.get("with_text") else [], "structuredContent": data}


def crash(args: dict) -> dict:
    record(event="crash")
    os._exit(1)


TOOLS: dict[str, tuple[dict, object]] = {
    "echo": ({"description": "Echo the text back (test server)", "inputSchema": schema(["text"], text="string")},
             lambda a: text(f"echo: {a.get('text')}")),
    "peek": ({"description": "Look at something without changing it", "inputSchema": {"properties": {"text": {"type": "string"}}},
              "annotations": READ_ONLY}, lambda a: text(f"peek: {a.get('text')}")),
    "bare": ({"title": "Bare tool"}, lambda a: text(json.dumps(a, sort_keys=True))),
    "args": ({"description": "Show the arguments", "inputSchema": {
        "type": "object", "additionalProperties": True,
        "properties": {"count": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
                       "opts": {"type": "object"}}}}, lambda a: text(json.dumps(a, sort_keys=True))),
    "sleep": ({"description": "Wait some seconds", "inputSchema": schema(["seconds"], seconds="number", tag="string"),
               "annotations": READ_ONLY}, sleep),
    "fail": ({"description": "Always fails", "inputSchema": schema(), "annotations": READ_ONLY},
             lambda a: {"content": [{"type": "text", "text": "it went wrong"}], "isError": True}),
    "huge": ({"description": "A long text", "inputSchema": schema([], size="integer"), "annotations": READ_ONLY}, huge),
    "parts": ({"description": "Parts of every kind", "inputSchema": schema(), "annotations": READ_ONLY}, parts),
    "struct": ({"description": "Structured content", "inputSchema": schema([], with_text="boolean"),
                "annotations": READ_ONLY}, struct),
    "blank": ({"description": "An empty text part between two", "inputSchema": schema(), "annotations": READ_ONLY},
              lambda a: {"content": [{"type": "text", "text": t} for t in ("first", "", "last")]}),
    "rpc_error": ({"description": "A protocol error", "inputSchema": schema()}, None),
    "crash": ({"description": "Exit while the call is pending", "inputSchema": schema()}, crash),
    "stamp": ({"description": "How long the server took", "inputSchema": schema()}, None),
}


def offered() -> list[dict]:
    """The tools/list entries, in order."""
    names = [n for n in OPTS.only.split(",") if n] or list(TOOLS)
    tools = [{"name": name, **TOOLS[name][0]} for name in names]
    tools += [{"name": name, "description": f"Echo as {name}", "inputSchema": schema(["text"], text="string")}
              for name in OPTS.tool]
    if OPTS.odd_tools:
        tools += ODD_TOOLS
    return tools


ODD_TOOLS = [
    {"name": "odd_annotations", "description": "annotations that are not an object", "annotations": "read-only",
     "inputSchema": schema()},
    {"name": "odd_schema", "description": "a schema that is not an object", "inputSchema": "anything goes"},
    {"name": "odd_properties", "description": 42, "inputSchema": {"type": "object", "properties": ["a", "b"],
                                                                  "required": "a"}},
    {"name": 7, "description": "a name that is not a string"},
    "not even an object",
]


def call(message: dict, received: float) -> None:
    """Answer one tools/call (in its own thread)."""
    params = message.get("params") or {}
    name, args = params.get("name"), params.get("arguments") or {}
    noise()
    if name in OPTS.tool:
        return write({"jsonrpc": "2.0", "id": message["id"], "result": text(f"{name}: {args.get('text')}")})
    if name == "rpc_error":
        return write({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32000, "message": "boom"}})
    if name == "stamp":
        result = text(json.dumps({"server_seconds": time.perf_counter() - received}))
        return write({"jsonrpc": "2.0", "id": message["id"], "result": result})
    if name not in TOOLS or TOOLS[name][1] is None:
        return write({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32602, "message": f"no tool {name}"}})
    write({"jsonrpc": "2.0", "id": message["id"], "result": TOOLS[name][1](args)})


class Client:
    """The line reader, with messages set aside while the server waits for the client's answers."""

    def __init__(self) -> None:
        self.backlog: collections.deque = collections.deque()

    def next(self) -> dict | None:
        if self.backlog:
            return self.backlog.popleft()
        while True:
            line = sys.stdin.buffer.readline()
            if not line:
                return None
            try:
                return json.loads(line)
            except ValueError:
                record(event="garbage", line=line.decode(errors="replace"))

    def ask(self) -> None:
        """Send the client requests of our own and wait for every answer."""
        asked = {"s-ping": "ping", "s-roots": "roots/list", "s-sampling": "sampling/createMessage"}
        for number, method in asked.items():
            write({"jsonrpc": "2.0", "id": number, "method": method, "params": {}})
        write({"jsonrpc": "2.0", "method": "notifications/message",
               "params": {"level": "info", "logger": "test", "data": "hello from the server"}})
        set_aside = []
        while asked:
            message = self.next()
            if message is None:
                return
            if "method" not in message and message.get("id") in asked:
                record(event="answer", method=asked.pop(message["id"]), message=message)
            else:
                set_aside.append(message)
        self.backlog.extend(set_aside)


def start() -> None:
    """Record the start, write the pid file, start the child."""
    if OPTS.stdout_noise:
        print("starting up (not JSON)", flush=True)
    if OPTS.deep_line:
        print("[" * 100_000 + "]" * 100_000, flush=True)
    noise()
    record(event="start", argv=sys.argv[1:], env=dict(os.environ), pid=os.getpid(), pgid=os.getpgid(0),
           sid=os.getsid(0), cwd=os.getcwd())
    if OPTS.pidfile:
        # an ignored signal stays ignored across exec: a stubborn child is born ignoring SIGTERM
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN if OPTS.child == "stubborn" else signal.SIG_DFL)
        output = None if OPTS.child == "holding" else subprocess.DEVNULL
        child = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, stdout=output, stderr=output)
        signal.signal(signal.SIGTERM, previous)
        with open(OPTS.pidfile + ".tmp", "w") as f:
            f.write(f"{os.getpid()} {child.pid}\n")
        os.replace(OPTS.pidfile + ".tmp", OPTS.pidfile)


def serve() -> None:
    """Answer messages until stdin ends."""
    if OPTS.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if OPTS.exit_at_start is not None:
        sys.stderr.write("exiting at start as asked\n")
        sys.exit(OPTS.exit_at_start)
    start()
    client, asked = Client(), False
    while (message := client.next()) is not None:
        received = time.perf_counter()
        method, number = message.get("method"), message.get("id")
        record(event="message", message=message)
        if method is None or number is None:  # an answer we did not wait for, or a notification
            continue
        if method == "initialize":
            time.sleep(OPTS.init_delay)
            version = (message.get("params") or {}).get("protocolVersion") or PROTOCOL
            write({"jsonrpc": "2.0", "id": number, "result": {
                "protocolVersion": version, "capabilities": {"tools": {"listChanged": False}, "logging": {}},
                "serverInfo": {"name": "solo-test-server", "version": "1.0"}}})
        elif method == "tools/list":
            if OPTS.ask_client and not asked:
                asked = True
                client.ask()
            tools, cursor = offered(), int((message.get("params") or {}).get("cursor") or 0)
            size = OPTS.page or len(tools)
            page = {"tools": tools[cursor: cursor + size]}
            if cursor + size < len(tools) or OPTS.endless_pages:
                page["nextCursor"] = str((cursor + size) % len(tools))
            write({"jsonrpc": "2.0", "id": number, "result": {"tools": 5} if OPTS.tools_not_a_list else page})
            while OPTS.stop_reading:
                time.sleep(3600)
        elif method == "tools/call":
            threading.Thread(target=call, args=(message, received), daemon=True).start()
        elif method == "ping":
            write({"jsonrpc": "2.0", "id": number, "result": {}})
        else:
            write({"jsonrpc": "2.0", "id": number, "error": {"code": -32601, "message": f"{method} not found"}})
    while OPTS.ignore_term:  # stdin ended: live on until killed
        time.sleep(3600)


if __name__ == "__main__":
    serve()
