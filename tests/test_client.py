"""The HTTP layer with `responses`: retries, waits honoured (sleep injected), messages, no retry on 4xx."""

from __future__ import annotations

import email.utils
import json
import os
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
    assert [e["attempt"] for e in logs] == list(range(2, retries + 2))
    if name.startswith("429"):
        assert waits == [3.0] and logs[0]["error"] == "HTTP 429: slow down" and logs[0]["error_status"] == 429


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
    model.model_info()
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
