"""The HTTP layer with `responses`: retries, waits honoured (sleep injected), messages, no retry on 4xx."""

from __future__ import annotations

import email.utils
import io
import json
import os
import socket
import time
from pathlib import Path

import pytest
import requests
import responses

from app import main as agent
from tests.fake_openrouter import reply

URL = "https://openrouter.test/api/v1/chat/completions"
OK = reply("fine")


def client(waits: list, retries: list, **overrides) -> agent.ModelClient:
    """A client whose waits and retry events are recorded instead of slept and shown."""
    cfg = agent.Config(api_key="sk-secret", cwd=Path("."), base_url="https://openrouter.test/api/v1/", **overrides)
    return agent.ModelClient(cfg, emit=lambda e: e["type"] == "api_retry" and retries.append(e), sleep=waits.append)


def error(code, message="oops", **extra):
    return {"error": {"code": code, "message": message, **extra}}


def http_date(seconds_ahead: float) -> str:
    return email.utils.formatdate(time.time() + seconds_ahead, usegmt=True)


CASES = {
    # name: ([(status, body, headers) or exception, ...], expected error message or None, retries)
    "429 honours Retry-After seconds": ([(429, error(429, "slow down"), {"Retry-After": "3"}), (200, OK, {})], None, 1),
    "503 then success": ([(503, error(503), {}), (200, OK, {})], None, 1),
    "408 then success": ([(408, error(408), {}), (200, OK, {})], None, 1),
    "524 and 529 then success": ([(524, error(524), {}), (529, error(529), {}), (200, OK, {})], None, 2),
    "connection reset then success": ([requests.ConnectionError("Connection aborted"), (200, OK, {})], None, 1),
    "read timeout then success": ([requests.ReadTimeout("read timed out"), (200, OK, {})], None, 1),
    "200 with error body": ([(200, error(502, "upstream died"), {}), (200, OK, {})], None, 1),
    "200 with no choices": ([(200, {"id": "x", "choices": []}, {}), (200, OK, {})], None, 1),
    "200 with finish_reason error": (
        [(200, {"choices": [{"message": {"role": "assistant", "content": ""}, "finish_reason": "error",
                             "error": {"code": 502, "message": "provider crashed"}}]}, {}), (200, OK, {})], None, 1),
    "non-JSON 502 page": ([(502, "<html><body>Bad gateway</body></html>", {}), (200, OK, {})], None, 1),
    "non-JSON 200": ([(200, "not json", {}), (200, OK, {})], None, 1),
    "a reply nested 990 deep": ([(200, '{"choices": [{"message": {"role": "assistant", "content": "x", "deep": '
                                  + "[" * 990 + "]" * 990 + "}}]}", {}), (200, OK, {})], None, 1),
    "500 every time": ([(500, error(500, "down"), {})] * 6, "HTTP 500: down", 5),
    "400 is final": ([(400, error(400, "bad request body"), {})], "HTTP 400: bad request body", 0),
    "401 hints at the key": ([(401, error(401, "No auth credentials found"), {})],
                             "HTTP 401: No auth credentials found (check OPENROUTER_API_KEY)", 0),
    "402 hints at credits": ([(402, error(402, "Insufficient credits"), {})],
                             "HTTP 402: Insufficient credits (the account is out of credits)", 0),
    "403 moderation": ([(403, error(403, "flagged", metadata={"reasons": ["x"]}), {})], "HTTP 403: flagged (the request was refused by moderation or a region rule)", 0),
    "404 no tool endpoints": ([(404, error(404, "No endpoints found that support tool use"), {})],
                              "HTTP 404: No endpoints found that support tool use (the model may not support tool calls)", 0),
    "200 carrying a 401": ([(200, error(401, "key revoked"), {})], "HTTP 401: key revoked (check OPENROUTER_API_KEY)", 0),
    "metadata.raw is shown": ([(400, error(400, "Provider returned error", metadata={"raw": "max_tokens too big"}), {})],
                              "HTTP 400: Provider returned error (upstream: max_tokens too big)", 0),
    "string code uses the status": ([(400, {"error": {"code": "invalid_model", "message": "no such model"}}, {})],
                                    "HTTP 400: no such model", 0),
    "non-JSON 400": ([(400, "<html>nope</html>", {})], "HTTP 400: the API sent a non-JSON reply: <html>nope</html>", 0),
    "unknown model hints at the form": ([(400, error(400, "claude-sonnet-4.5 is not a valid model ID"), {})],
                                        ("HTTP 400: claude-sonnet-4.5 is not a valid model ID (model names look like "
                                         "anthropic/claude-sonnet-4.5; see https://openrouter.ai/models)"), 0),
}


@pytest.mark.parametrize("name", list(CASES))
@responses.activate
def test_failures(name):
    answers, expected, retries = CASES[name]
    for answer in answers:
        if isinstance(answer, Exception):
            responses.add(responses.POST, URL, body=answer)
        else:
            status, body, headers = answer
            kwargs = {"json": body} if isinstance(body, dict) else {"body": body}
            responses.add(responses.POST, URL, status=status, headers=headers, **kwargs)
    waits, logs = [], []
    model = client(waits, logs, max_attempts=6)
    if expected is None:
        assert model({"model": "m", "messages": []})["choices"][0]["message"]["content"] == "fine"
    else:
        with pytest.raises(agent.ApiError) as caught:
            model({"model": "m", "messages": []})
        assert str(caught.value) == expected
    assert len(responses.calls) == retries + 1
    assert len(waits) == len(logs) == retries
    assert [e["retry_delay_ms"] for e in logs] == [int(w * 1000) for w in waits]
    assert [e["attempt"] for e in logs] == list(range(1, retries + 1))  # retries counted from 1, as Claude Code does
    if name.startswith("429"):
        assert waits == [3.0] and logs[0]["message"] == "HTTP 429: slow down" and logs[0]["error_status"] == 429
        assert logs[0]["error"] == "rate_limit"  # Claude Code's category; the text is in `message`


@pytest.mark.parametrize("body", ["<html><body>Not Found</body></html>", error(404, "Not Found")])
@responses.activate
def test_a_404_from_a_base_url_not_ending_in_api_v1_says_to_check_it(body):
    kwargs = {"json": body} if isinstance(body, dict) else {"body": body}
    responses.add(responses.POST, "https://gateway.test/openrouter/chat/completions", status=404, **kwargs)
    cfg = agent.Config(api_key="k", cwd=Path("."), base_url="https://gateway.test/openrouter")
    with pytest.raises(agent.ApiError) as caught:
        agent.ModelClient(cfg, emit=lambda e: None, sleep=pytest.fail)({"messages": []})
    assert str(caught.value).startswith("HTTP 404: ") and len(responses.calls) == 1
    assert str(caught.value).endswith("(check OPENROUTER_BASE_URL: OpenRouter's is https://openrouter.ai/api/v1, "
                                      "ending in /api/v1)")


@pytest.mark.parametrize("code, words", [(socket.EAI_AGAIN, "Temporary failure in name resolution"),
                                         (socket.EAI_NONAME, "Name or service not known")])
def test_no_network_fails_at_once_with_one_line(tmp_path, monkeypatch, code, words):
    def unresolvable(*args, **kwargs):
        raise socket.gaierror(code, words)
    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)  # as with no network at all: no name resolves
    monkeypatch.chdir(tmp_path)
    out, err, started = io.StringIO(), io.StringIO(), time.monotonic()
    env = {"OPENROUTER_API_KEY": "k", "OPENROUTER_BASE_URL": "https://openrouter.invalid/api/v1", "HOME": str(tmp_path)}
    assert agent.main(["-p", "hi"], env=env, streams=agent.Streams(None, out, err)) == 1
    assert time.monotonic() - started < 3 and out.getvalue() == ""
    assert err.getvalue() == ("solo: could not reach https://openrouter.invalid/api/v1/chat/completions: the name "
                              "openrouter.invalid does not resolve (no network? check OPENROUTER_BASE_URL)\n")


@responses.activate
def test_check_model_takes_listed_names_refuses_others_and_says_when_it_cannot_check():
    models = "https://openrouter.test/api/v1/models"
    responses.add(responses.GET, models, json={"data": [{"id": "anthropic/claude-sonnet-4.5"}, {"id": "x/y"}]})
    notices = []
    model = agent.ModelClient(agent.Config(api_key="k", cwd=Path("."), base_url="https://openrouter.test/api/v1"),
                              emit=notices.append)
    model.check_model("anthropic/claude-sonnet-4.5")
    with pytest.raises(agent.UsageError, match="did you mean anthropic/claude-sonnet-4.5"):
        model.check_model("claude-sonnet-4.5")
    responses.replace(responses.GET, models, status=404, json=error(404, "no list here"))
    model.check_model("local-model")  # a server without a model list: the name is taken, with a note
    assert notices == [{"type": "notice", "text": "could not check local-model against the API's model list"}]


@responses.activate
def test_retry_after_http_date_and_cap():
    responses.add(responses.POST, URL, status=429, json=error(429), headers={"Retry-After": http_date(5)})
    responses.add(responses.POST, URL, status=429, json=error(429), headers={"Retry-After": "99999"})
    responses.add(responses.POST, URL, json=OK)
    waits = []
    client(waits, []).__call__({"messages": []})
    assert 3 <= waits[0] <= 5 and waits[1] == agent.RETRY_AFTER_CAP


@responses.activate
def test_backoff_is_exponential_jittered_and_bounded():
    for _ in range(6):
        responses.add(responses.POST, URL, status=502, json=error(502))
    waits = []
    with pytest.raises(agent.ApiError):
        client(waits, [], max_attempts=6)({"messages": []})
    assert len(waits) == 5
    for attempt, wait in enumerate(waits):
        full = min(agent.BACKOFF_CAP, agent.BACKOFF_BASE * 2 ** attempt)
        assert full / 2 <= wait <= full


@responses.activate
def test_total_wait_is_capped():
    for _ in range(6):
        responses.add(responses.POST, URL, status=429, json=error(429), headers={"Retry-After": "60"})
    waits = []
    with pytest.raises(agent.ApiError):
        client(waits, [], max_attempts=6)({"messages": []})
    assert sum(waits) <= agent.TOTAL_WAIT_CAP and len(waits) == 3


@pytest.mark.parametrize("body", [
    error(400, "This endpoint's maximum context length is 200000 tokens. However, you requested 250000"),
    error(400, "prompt is too long", metadata={"error_type": "context_length_exceeded"}),
])
@responses.activate
def test_context_overflow_is_recognised(body):
    responses.add(responses.POST, URL, status=400, json=body)
    with pytest.raises(agent.ContextOverflow):
        client([], [])({"messages": []})


@pytest.mark.parametrize("status, message, error, overflow", [
    (400, "the request exceeds the available context size, try increasing it", None, True),  # llama.cpp
    (400, "request (4476 tokens) exceeds the available context size (4096 tokens)", None, True),  # llama.cpp
    (400, "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in "  # vLLM
          "the messages, 1000 in the completion). Please reduce the length of the messages or completion.", None, True),
    (400, "prompt is too long: 250000 tokens > 200000 maximum", None, True),  # Anthropic
    (413, "prompt is too large", None, True),
    (400, "Provider returned error", {"metadata": {"error_type": "context_length_exceeded"}}, True),
    (400, "invalid model id", None, False),
    (400, "max_tokens must be at least 1", None, False),
    (429, "prompt is too long", None, False),  # only a refusal of the request itself (400, 413) is an overflow
    (500, "the request exceeds the available context size", None, False),
])
def test_context_overflow_wordings(status, message, error, overflow):
    assert agent.is_overflow(status, message, error) is overflow


@responses.activate
def test_netrc_never_replaces_the_api_key():
    netrc = os.path.join(os.environ["HOME"], ".netrc")  # the test's own home (conftest)
    with open(netrc, "w") as f:
        f.write("machine openrouter.test login someone password hunter2\n")
    os.chmod(netrc, 0o600)
    responses.add(responses.POST, URL, json=OK)
    responses.add(responses.GET, "https://openrouter.test/api/v1/models", json={"data": []})
    model = client([], [])
    model({"messages": []})
    assert responses.calls[0].request.headers["Authorization"] == "Bearer sk-secret"
    model.model_info(model.cfg.model)
    assert responses.calls[1].request.headers["Authorization"] == "Bearer sk-secret"


@responses.activate
def test_request_wire_format():
    responses.add(responses.POST, URL, json=OK)
    body = {"model": "anthropic/claude-haiku-4.5", "messages": [{"role": "user", "content": "ü"}]}
    client([], [])(body)
    sent = responses.calls[0].request
    assert sent.url == URL
    assert sent.headers["Authorization"] == "Bearer sk-secret"
    assert sent.headers["Content-Type"] == "application/json"
    assert sent.headers["X-OpenRouter-Title"] == "solo" and sent.headers["HTTP-Referer"].startswith("https://")
    assert json.loads(sent.body) == body and sent.body == agent.encode(body)


@responses.activate
def test_timeouts_are_passed_to_requests(monkeypatch):
    seen = {}
    responses.add(responses.POST, URL, json=OK)
    model = client([], [], connect_timeout=2.5, read_timeout=7.0)
    original = model.session.post
    def spy(*args, **kwargs):
        seen.update(kwargs)
        return original(*args, **kwargs)
    monkeypatch.setattr(model.session, "post", spy)
    model({"messages": []})
    assert seen["timeout"] == (2.5, 7.0)


# --- Streaming: server-sent events rebuilt into the reply a non-streamed request would get ----------


def sse(*events) -> bytes:
    """Events as a server sends them: dicts as data lines, strings as they are."""
    return b"".join((e if isinstance(e, str) else f"data: {json.dumps(e)}\n\n").encode() for e in events)


def chunk(delta=None, finish=None, **top):
    return {"id": "gen-1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}], **top}


def rebuild(data: bytes, cuts=()) -> tuple[dict, list]:
    """Feed the bytes cut at these offsets; return the response and the deltas seen."""
    deltas = []
    reply = agent.StreamedReply(deltas.append)
    for start, end in zip((0, *cuts), (*cuts, len(data))):
        reply.feed(data[start:end])
    return reply.result(), deltas


USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.01, "prompt_tokens_details": {"cached_tokens": 4}}
TEXT_STREAM = sse(": OPENROUTER PROCESSING\n\n", chunk({"role": "assistant", "content": ""}), chunk({"content": "Hél"}),
                  chunk({"content": "lo ✓"}), chunk({}, "stop"), {"id": "gen-1", "choices": [], "usage": USAGE},
                  "data: [DONE]\n\n")


def test_a_stream_split_at_every_byte_offset_gives_the_same_reply():
    whole, _ = rebuild(TEXT_STREAM)
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "Héllo ✓"}
    assert whole["choices"][0]["finish_reason"] == "stop" and whole["usage"] == USAGE and whole["id"] == "gen-1"
    for cut in range(1, len(TEXT_STREAM)):
        assert rebuild(TEXT_STREAM, (cut,))[0] == whole, cut
    assert rebuild(TEXT_STREAM, tuple(range(1, len(TEXT_STREAM))))[0] == whole  # one byte at a time


def test_crlf_lines_multi_line_data_and_comments():
    data = TEXT_STREAM.replace(b"\n", b"\r\n") + b": trailing comment\r\n"
    assert rebuild(data)[0]["choices"][0]["message"]["content"] == "Héllo ✓"
    split = b'data: {"choices": [{"index": 0,\ndata: "delta": {"content": "x"}, "finish_reason": "stop"}]}\n\n'
    assert rebuild(split)[0]["choices"][0]["message"]["content"] == "x"  # data lines of one event are joined


def call_chunk(index, **fields):
    return chunk({"tool_calls": [{"index": index, **fields}]})


@pytest.mark.parametrize("pattern", [
    # id and name first with arguments "" then string fragments
    [call_chunk(0, id="a", type="function", function={"name": "Read", "arguments": ""}),
     call_chunk(0, function={"arguments": '{"file_'}), call_chunk(0, function={"arguments": 'path": "x"}'})],
    # the whole JSON in the first fragment
    [call_chunk(0, id="a", type="function", function={"name": "Read", "arguments": '{"file_path": "x"}'})],
    # arguments null first
    [call_chunk(0, id="a", type="function", function={"name": "Read", "arguments": None}),
     call_chunk(0, function={"arguments": '{"file_path": "x"}'})],
    # the id repeated on every fragment
    [call_chunk(0, id="a", type="function", function={"name": "Read"}),
     call_chunk(0, id="a", function={"arguments": '{"file_path"'}), call_chunk(0, id="a", function={"arguments": ': "x"}'})],
])
def test_tool_call_fragments_merge_by_index(pattern):
    response, _ = rebuild(sse(chunk({"role": "assistant", "content": None}), *pattern, chunk({}, "tool_calls")))
    calls = response["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("a", "Read", {"file_path": "x"})]


def test_fragments_of_several_calls_interleaved():
    response, _ = rebuild(sse(
        call_chunk(1, id="b", type="function", function={"name": "Glob", "arguments": ""}),
        call_chunk(0, id="a", type="function", function={"name": "Read", "arguments": '{"file_path":'}),
        call_chunk(1, function={"arguments": '{"pattern": "*"}'}), call_chunk(0, function={"arguments": ' "x"}'}),
        chunk({}, "tool_calls")))
    calls = response["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["arguments"]) for c in calls] == [("a", '{"file_path": "x"}'), ("b", '{"pattern": "*"}')]


def test_reasoning_and_its_details_merge_by_their_own_index():
    response, deltas = rebuild(sse(
        chunk({"role": "assistant", "reasoning": "Let me ", "reasoning_details": [
            {"type": "reasoning.text", "text": "Let me ", "index": 0, "format": "anthropic-claude-v1"}]}),
        chunk({"reasoning": "think", "reasoning_details": [
            {"type": "reasoning.text", "text": "think", "index": 0, "format": "anthropic-claude-v1"}]}),
        chunk({"reasoning_details": [{"type": "reasoning.text", "signature": "sig", "index": 0}]}),
        chunk({"content": "42", "refusal": None}), chunk({}, "stop")))
    message = response["choices"][0]["message"]
    assert message == {"role": "assistant", "reasoning": "Let me think", "content": "42", "refusal": None,
                       "reasoning_details": [{"type": "reasoning.text", "text": "Let me think", "index": 0,
                                              "format": "anthropic-claude-v1", "signature": "sig"}]}
    assert [d.get("content") for d in deltas if d.get("content")] == ["42"]


@pytest.mark.parametrize("data, message, retryable", [
    (sse(chunk({"reasoning": "hmm"}), {"error": {"code": 400, "message": "Token limit reached"},
                                        "choices": [{"index": 0, "delta": {}, "finish_reason": "error"}]},
         "data: [DONE]\n\n"), "HTTP 400: Token limit reached", False),
    (sse(chunk({"content": "par"}), {"error": {"code": 502, "message": "Provider disconnected"}}), "HTTP 502", True),
    (sse(chunk({"content": "par"}), {"choices": [{"index": 0, "delta": {}, "finish_reason": "error",
                                                  "error": {"message": "overloaded"}}]}), "mid-reply: overloaded", True),
    (sse(chunk({"content": "cut off"})), "the stream stopped before the reply was complete", True),
    (b"data: {not json\n\n", "malformed stream event", True),
])
def test_mid_stream_errors_end_the_attempt(data, message, retryable):
    with pytest.raises(agent.ApiError) as caught:
        rebuild(data)
    assert message in str(caught.value) and caught.value.retryable == retryable


def test_a_stream_with_a_finish_reason_but_no_done_is_complete():
    response, _ = rebuild(sse(chunk({"content": "ok"}), chunk({}, "stop")))
    assert response["choices"][0]["message"]["content"] == "ok"


@responses.activate
def test_a_streamed_reply_over_http_and_its_events():
    responses.add(responses.POST, URL, body=TEXT_STREAM, content_type="text/event-stream")
    events = []
    cfg = agent.Config(api_key="k", cwd=Path("."), base_url="https://openrouter.test/api/v1")
    response = agent.ModelClient(cfg, emit=events.append, sleep=lambda s: None)({"messages": [], "stream": True})
    assert response["choices"][0]["message"]["content"] == "Héllo ✓" and response["usage"] == USAGE
    assert "".join(e["delta"].get("content") or "" for e in events if e["type"] == "delta") == "Héllo ✓"
    assert [e["type"] for e in events][-1] == "reply" and events[-1]["status"] == 200


def test_an_invalid_utf8_byte_is_replaced_and_an_empty_event_ignored():
    """A whole reply with a bad byte is decoded with replacement: a streamed one is too (issue 21, item 10)."""
    bad = sse(chunk({"content": "caf"})).replace(b'caf"', b'caf\xe9"')
    response, _ = rebuild(b"data:\n\n" + bad + b"data: \n\n" + sse(chunk({}, "stop"), "data: [DONE]\n\n"))
    assert response["choices"][0]["message"]["content"] == "caf\ufffd"


# A real reply of an OpenAI reasoning model through OpenRouter: two reasoning items that share index 0
REASONING_DETAILS = [
    {"type": "reasoning.summary", "summary": "**Checking the file**\n\nI read it first.", "id": "rs_0a1b2c",
     "format": "openai-responses-v1", "index": 0},
    {"type": "reasoning.encrypted", "data": "gAAAAABpQ3xKc2VjcmV0LXJlYXNvbmluZy1ibG9i", "id": "rs_0a1b2c",
     "format": "openai-responses-v1", "index": 0},
]


def test_reasoning_items_of_one_index_but_different_types_stay_apart():
    """Streamed, the summary and the encrypted item come back exactly as a whole reply carries them (item 14)."""
    summary, encrypted = REASONING_DETAILS
    pieces = [{**summary, "summary": summary["summary"][:12]}, {"type": summary["type"], "index": 0,
                                                                 "summary": summary["summary"][12:]}]
    response, _ = rebuild(sse(*[chunk({"reasoning_details": [p]}) for p in pieces],
                              chunk({"reasoning_details": [encrypted]}), chunk({"content": "ok"}), chunk({}, "stop")))
    assert response["choices"][0]["message"]["reasoning_details"] == REASONING_DETAILS
