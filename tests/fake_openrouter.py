"""A fake OpenRouter on 127.0.0.1 for end-to-end tests and benchmarks.

A test hands it a `model`: a function from the parsed request body to what to answer: a response dict
(sent as JSON 200, or, when the request asks to stream, as OpenRouter streams it: server-sent events
with the text in pieces and tool calls in fragments), a `Stream` of exact events, a `Raw(status, body,
headers)`, or `DROP` to close the connection unanswered. The server checks what the real proxy checks
(path, model family, auth header), validates every body against OpenAI's published request schema, and
records every request.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# OpenAI's published request schema (MIT, see its $comment), copied from shared/schemas so the
# tests stand alone in any clone.
SCHEMA_PATH = Path(__file__).resolve().parent / "chat-completions-request.schema.json"
DROP = object()


@dataclass
class Raw:
    """An exact HTTP answer."""

    status: int
    body: Any = ""
    headers: dict = field(default_factory=dict)


@dataclass
class Stream:
    """A streamed answer: dicts are sent as `data:` events, strings as they are (': comment' lines,
    'data: [DONE]'), numbers are pauses in seconds and functions are called (to wait for a test's
    signal); `drop` closes the connection after them, unfinished."""

    events: list
    drop: bool = False


def pieces(text: str, size: int) -> list[str]:
    """Text cut into pieces of `size` characters."""
    return [text[i: i + size] for i in range(0, len(text), size)]


def streamed(response: dict, size: int = 7) -> Stream:
    """A response (or an error body) as OpenRouter streams it: the role first, the text in pieces of `size`
    characters, each tool call's id and name then its arguments in fragments, the finish reason, the usage,
    [DONE]."""
    if not response.get("choices"):
        return Stream([response, "data: [DONE]\n\n"])
    base = {k: response[k] for k in ("id", "created", "model", "provider") if k in response}
    choice, message = response["choices"][0], dict(response["choices"][0]["message"])

    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {**base, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "native_finish_reason": None}]}

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in pieces(message.pop("content", None) or "", size)]
    for index, call in enumerate(message.pop("tool_calls", None) or []):
        function = call["function"]
        events.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                             "function": {"name": function["name"], "arguments": ""}}]}))
        events += [chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                   for piece in pieces(function["arguments"], 9)]
    events += [chunk({key: value}) for key, value in message.items() if key != "role"]
    events += [chunk({}, choice.get("finish_reason")), {**base, "object": "chat.completion.chunk", "choices": [],
                                                         "usage": response.get("usage")}, "data: [DONE]\n\n"]
    return Stream(events)


def call(name: str, args: Any = None, id: str | None = None) -> dict:
    """A tool call as a model sends it; dict arguments are JSON-encoded, strings sent as they are."""
    arguments = args if isinstance(args, str) else json.dumps(args or {})
    return {"id": id or f"call_{uuid.uuid4().hex[:10]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def reply(content: str | None = None, tool_calls: list | None = None, finish_reason: str | None = None,
          usage: dict | None = None, **message: Any) -> dict:
    """A chat.completion response body like OpenRouter's."""
    msg = {"role": "assistant", "content": content, **message}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return {
        "id": f"gen-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
        "model": "anthropic/claude-4.5-haiku-20251001", "provider": "Anthropic",
        "choices": [{"index": 0, "message": msg, "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
                     "native_finish_reason": "end_turn"}],
        "usage": usage or {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110, "cost": 0.001,
                           "prompt_tokens_details": {"cached_tokens": 50, "cache_write_tokens": 20}},
    }


def tool_then(calls: list, answer: Any) -> Callable[[dict], dict]:
    """A model that makes these tool calls first, then answers: a text, or a function of the request."""
    def model(body: dict) -> dict:
        if body["messages"][-1]["role"] == "user":
            return reply(tool_calls=calls)
        return reply(answer(body) if callable(answer) else answer)
    return model


def last_result(body: dict) -> str:
    """The content of the request's last message (a tool result, after tool calls)."""
    return body["messages"][-1]["content"]


def tool_results(body: dict) -> list[str]:
    """The tool results that follow the last assistant message."""
    results = []
    for message in reversed(body["messages"]):
        if message["role"] != "tool":
            break
        results.insert(0, message["content"])
    return results


def load_validator():
    """A Draft 2020-12 validator for request bodies."""
    import jsonschema  # a test dependency; the benchmark runs without validation
    return jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


class FakeOpenRouter:
    """The server; use as a context manager, read `.url`, `.bodies`, `.raw`, `.headers`, `.problems`."""

    def __init__(self, model: Callable[[dict], Any], *, validate: bool = True, accept: str = "anthropic/claude-haiku",
                 models: list[dict] | None = None):
        self.model, self.accept, self.models = model, accept, models  # models: GET /models's `data`, or 404
        self.gets: list[str] = []
        self.bodies: list[dict] = []
        self.raw: list[bytes] = []
        self.headers: list[dict] = []
        self.times: list[float] = []
        self.problems: list[str] = []
        self.validator = load_validator() if validate else None
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/api/v1"

    def __enter__(self) -> FakeOpenRouter:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, path: str, headers: dict, raw: bytes) -> Any:
        """What to send for one request."""
        if path != "/api/v1/chat/completions":
            self.problems.append(f"wrong path {path}")
            return Raw(404, {"error": {"code": 404, "message": "Not Found"}})
        if not headers.get("Authorization", "").startswith("Bearer "):
            return Raw(401, {"error": {"code": 401, "message": "No auth credentials found"}})
        body = json.loads(raw)
        with self.lock:
            self.bodies.append(body)
            self.raw.append(raw)
            self.headers.append(headers)
            self.times.append(time.monotonic())
        if self.validator:
            for error in self.validator.iter_errors(body):
                self.problems.append(f"schema: {error.message[:200]} at {list(error.absolute_path)}")
        if not str(body.get("model", "")).startswith(self.accept):
            return Raw(400, {"error": {"code": 400, "message": f"{body.get('model')} is not a valid model ID"}})
        return self.model(body)

    def handler(self) -> type:
        """The request handler class bound to this server."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else headers and body wait on a delayed ACK (~40 ms a turn)

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.gets.append(self.path)
                found = self.path == "/api/v1/models" and server.models is not None
                self.reply_with(Raw(200, {"data": server.models}) if found else Raw(404, {"error": {"code": 404}}))

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    result = server.answer(self.path, dict(self.headers), raw)
                except Exception as error:  # a broken script shows up as a 500 and a problem
                    server.problems.append(f"model script raised {error!r}")
                    result = Raw(500, {"error": {"code": 500, "message": repr(error)}})
                if isinstance(result, dict) and json.loads(raw or b"{}").get("stream"):
                    result = streamed(result)
                self.reply_with(result)

            def reply_with(self, result: Any) -> None:
                if isinstance(result, Stream):
                    return self.stream(result)
                if result is DROP:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if not isinstance(result, Raw):
                    result = Raw(200, result)
                data = result.body if isinstance(result.body, (bytes, str)) else json.dumps(result.body)
                data = data.encode() if isinstance(data, str) else data
                self.send_response(result.status)
                headers = {"Content-Type": "application/json", **result.headers}
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def stream(self, answer: Stream) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in answer.events:
                    if isinstance(event, (int, float)) or callable(event):
                        time.sleep(event) if isinstance(event, (int, float)) else event()
                        continue
                    data = (event if isinstance(event, str) else f"data: {json.dumps(event)}\n\n").encode()
                    try:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                    except OSError:  # the client went away (cancelled)
                        return
                if answer.drop:
                    self.close_connection = True
                    self.connection.shutdown(2)
                else:
                    with contextlib.suppress(OSError):  # the client went away after the last event
                        self.wfile.write(b"0\r\n\r\n")

        return Handler
