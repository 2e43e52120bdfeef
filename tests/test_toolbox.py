"""The rest of Claude Code's toolbox: images and notebooks in Read, NotebookEdit, background shells, TodoWrite,
WebFetch, WebSearch and sub-agents (Agent); in process against real files and a local HTTP server, then end to
end against the fake OpenRouter."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import io
import json
import os
import re
import struct
import subprocess
import sys
import termios
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from app import main as agent
from tests.fake_openrouter import Raw, call, reply, tool_results

TOOLS = {tool.name: tool for tool in agent.TOOLS}


def png(width: int, height: int) -> bytes:
    """A real PNG of one red colour, written byte by byte."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\0" + b"\xff\x00\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def jpeg(width: int, height: int) -> bytes:
    """A JPEG's markers as a reader sees them: start, JFIF, a frame header with the size, end."""
    return (b"\xff\xd8\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0\1\1\0\0\1\0\1\0\0"
            + b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\1\x11\0" + b"\xff\xd9")


def run(ctx: agent.ToolContext, name: str, **args) -> str:
    return agent.run_tool_call({"id": "c", "function": {"name": name, "arguments": json.dumps(args)}}, TOOLS, ctx)


# --- Images ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, data, kind, size", [
    ("shot.png", png(3, 2), "image/png", "3x2"),
    ("photo.jpg", jpeg(640, 480), "image/jpeg", "640x480"),
    ("anim.gif", b"GIF89a" + struct.pack("<HH", 5, 7) + b"\0" * 10 + b";", "image/gif", "5x7"),
    ("pic.webp", b"RIFF" + struct.pack("<I", 22) + b"WEBPVP8X" + b"\0" * 8 + (99).to_bytes(3, "little")
     + (49).to_bytes(3, "little"), "image/webp", "100x50"),
])
def test_read_returns_an_image_with_its_size(ctx, name, data, kind, size):
    (ctx.cwd / name).write_bytes(data)
    result = run(ctx, "Read", file_path=name)
    assert isinstance(result, agent.Attached) and f"{size} pixels" in result and f"{len(data)} bytes" in result
    assert result.parts[0]["image_url"]["url"].startswith(f"data:{kind};base64,")


def test_corrupt_large_and_unseeable_images_are_errors(ctx):
    (ctx.cwd / "cut.png").write_bytes(png(4, 4)[:-6])
    (ctx.cwd / "cut.jpg").write_bytes(jpeg(4, 4)[:20])
    with open(ctx.cwd / "huge.png", "wb") as f:
        f.write(png(1, 1))
        f.truncate(5 * 1024 * 1024 + 1)
    assert run(ctx, "Read", file_path="cut.png") == "Error: cut.png is not a valid PNG image (corrupt or cut short)"
    assert run(ctx, "Read", file_path="cut.jpg").startswith("Error: cut.jpg is not a valid JPEG image")
    assert run(ctx, "Read", file_path="huge.png") == \
        "Error: huge.png is an image of 5242881 bytes; images over 5 MB are not sent"
    (ctx.cwd / "ok.png").write_bytes(png(1, 1))
    blind = ctx._replace(blind=lambda: "text/only-model")
    assert run(blind, "Read", file_path="ok.png") == \
        "Error: the model text/only-model cannot take images (OpenRouter's model list gives it no image input)"


def test_images_follow_all_tool_messages_of_a_reply(ctx):
    (ctx.cwd / "a.png").write_bytes(png(2, 2))
    message = {"role": "assistant", "content": None, "tool_calls": [
        call("Read", {"file_path": "a.png"}, id="1"), call("Glob", {"pattern": "*.png"}, id="2")]}
    messages: list[dict] = []
    agent.run_calls(message, TOOLS, ctx, messages, lambda event: None, cut=False)
    assert [m["role"] for m in messages] == ["tool", "tool", "user"]
    assert all(isinstance(m["content"], str) for m in messages[:2])
    assert [p["type"] for p in messages[2]["content"]] == ["text", "image_url"]


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims a size (checksums right, no pixel data): what a decompression bomb looks like."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + \
        chunk(b"IEND", b"")


def test_images_larger_than_the_model_takes_are_errors(ctx):
    (ctx.cwd / "bomb.png").write_bytes(png_claiming(100_000, 100_000))
    (ctx.cwd / "wide.png").write_bytes(png_claiming(9_000, 10))
    assert run(ctx, "Read", file_path="bomb.png") == \
        "Error: bomb.png is an image of 100000x100000 pixels; the model takes at most 16,384 pixels a side"
    assert isinstance(run(ctx, "Read", file_path="wide.png"), agent.Attached)
    anthropic = ctx._replace(image_side=lambda: agent.side_limit("anthropic/claude-haiku-4.5"))
    assert run(anthropic, "Read", file_path="wide.png") == \
        "Error: wide.png is an image of 9000x10 pixels; the model takes at most 8,000 pixels a side"


def test_notebook_output_images_pass_the_same_checks_as_any_image(ctx):
    big = png(1, 1)[:-12] + b"\0" * (5 << 20) + png(1, 1)[-12:]
    outputs = [{"output_type": "display_data", "data": {"image/png": base64.b64encode(data).decode()}}
               for data in (big, png(4, 4)[:-6], png_claiming(100_000, 100_000), b"GIF89a not a png", png(3, 1))]
    _, text = notebook(code("plots", ["plot()"], outputs))
    (ctx.cwd / "nb.ipynb").write_text(text)
    result = run(ctx._replace(image_side=lambda: 8000), "Read", file_path="nb.ipynb")
    assert "[image/png output not shown: this image/png output is an image of 5242949 bytes; images over 5 MB" in result
    assert "[image/png output not shown: this image/png output is not a valid PNG image (corrupt or cut short)]" in result
    assert "is an image of 100000x100000 pixels; the model takes at most 8,000 pixels a side]" in result
    assert "[image/png output: GIF image" not in result and "output is not a valid GIF image" in result
    assert "[image/png output: PNG image, 3x1 pixels, " in result and "; image 1 in the next message]" in result
    assert [part["image_url"]["url"] for part in result.parts] == \
        ["data:image/png;base64," + base64.b64encode(png(3, 1)).decode()]


def test_every_image_is_checked_before_a_request_and_a_bad_one_becomes_a_note(ctx):
    def part(url: str) -> dict:
        return {"type": "image_url", "image_url": {"url": url}}
    as_png = "data:image/png;base64," + base64.b64encode(jpeg(10, 10)).decode()
    bomb = "data:image/png;base64," + base64.b64encode(png_claiming(9_000, 9_000)).decode()
    messages = [{"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "text", "text": "look"}, part(as_png), part(bomb),
                                             part("https://example.org/a.png"), part("data:image/png;base64,@@")]}]
    notes = agent.vet_images(messages, "anthropic/claude-haiku-4.5")
    assert notes == ["[an image was not sent: it is an image of 9000x9000 pixels; the model takes at most 8,000 "
                     "pixels a side]", "[an image was not sent: it is not valid base64]"]
    assert messages[1]["content"][:2] == [{"type": "text", "text": "look"},
                                          part(as_png.replace("image/png", "image/jpeg"))]  # named as its bytes are
    assert messages[1]["content"][2:] == [{"type": "text", "text": notes[0]}, part("https://example.org/a.png"),
                                          {"type": "text", "text": notes[1]}]
    assert agent.vet_images(messages, "openai/gpt-4o") == []  # the notes stay; nothing left to check


# --- Notebooks ------------------------------------------------------------------------------------


def notebook(*cells: dict, indent: int = 1) -> tuple[dict, str]:
    """A notebook and its text as nbformat writes it (sorted keys, one-space indent, a final newline)."""
    nb = {"cells": list(cells), "metadata": {"kernelspec": {"name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}
    return nb, json.dumps(nb, indent=indent, sort_keys=True, ensure_ascii=False) + "\n"


def code(cell_id: str, source: list[str], outputs: list | None = None) -> dict:
    return {"cell_type": "code", "execution_count": 1, "id": cell_id, "metadata": {}, "outputs": outputs or [],
            "source": source}


def markdown(cell_id: str, source: list[str]) -> dict:
    return {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": source}


def test_read_shows_cells_with_bounded_outputs_and_images(ctx):
    encoded = base64.b64encode(png(2, 2)).decode()
    image = {"output_type": "display_data", "data": {"image/png": encoded[:20] + "\n" + encoded[20:],
                                                     "text/plain": ["<Figure>"]}, "metadata": {}}
    _, text = notebook(markdown("intro", ["# Title\n", "Some text"]),
                       code("run", ["print('x' * 5000)"], [{"output_type": "stream", "name": "stdout",
                                                           "text": ["x" * 5000 + "\n"]}, image]))
    (ctx.cwd / "nb.ipynb").write_text(text)
    result = run(ctx, "Read", file_path="nb.ipynb")
    assert result.startswith('<cell id="intro" type="markdown">\n# Title\nSome text\n</cell>\n'
                             '<cell id="run" type="code" execution_count=1>\nprint(')
    assert "characters omitted" in result and len(result) < 3000
    assert result.parts == ({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{encoded}"}},)
    assert "[image/png output: PNG image, 2x2 pixels" in result


def test_a_cell_whose_source_list_holds_a_number_is_shown(ctx):
    _, text = notebook(code("odd", ["x = ", 1, "\n", None]), markdown("fine", ["ok"]))
    (ctx.cwd / "nb.ipynb").write_text(text)
    assert run(ctx, "Read", file_path="nb.ipynb") == '<cell id="odd" type="code" execution_count=1>\nx = 1\nnull\n' \
        '</cell>\n<cell id="fine" type="markdown">\nok\n</cell>'


def test_a_notebook_with_a_byte_order_mark_is_editable_and_keeps_it(ctx):
    nb, text = notebook(markdown("a", ["# A"]), code("b", ["x = 1"]))
    path = ctx.cwd / "nb.ipynb"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert run(ctx, "Read", file_path="nb.ipynb").startswith('<cell id="a" type="markdown">\n# A\n</cell>')
    assert run(ctx, "NotebookEdit", notebook_path="nb.ipynb", cell_id="a", new_source="# B") == \
        "Replaced cell a in nb.ipynb"
    nb["cells"][0]["source"] = ["# B"]
    assert path.read_bytes() == b"\xef\xbb\xbf" + (json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False)
                                                   + "\n").encode()


def test_a_notebook_over_the_edit_cap_is_read_as_streamed_text(tmp_path):
    """Parsing a notebook whole costs several times its size: one over NotebookEdit's 20 MB is read as text."""
    path = tmp_path / "big.ipynb"
    output = {"output_type": "stream", "name": "stdout", "text": ["y" * 999 + "\n"] * 40_000}  # 40 MB of output
    path.write_text(notebook(code("big", ["print(y)"], [output]))[1])
    probe = (f"import resource, json\nfrom app import main as agent\nfrom tests.test_toolbox import run\n"
             f"ctx = agent.ToolContext(cwd={str(tmp_path)!r}, env={{}})\n"
             f"before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
             f"result = run(ctx, 'Read', file_path='big.ipynb', limit=30)\n"
             f"print(json.dumps([result, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before]))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).parents[1], capture_output=True, text=True,
                          timeout=120)
    result, grown_kb = json.loads(done.stdout)
    assert result.startswith('{\n "cells": [\n  {\n   "cell_type": "code",') and "Use offset=31 to read on." in result
    assert result.endswith("[big.ipynb is a notebook over 20 MB: shown as its JSON text]")
    assert grown_kb < 20_000, grown_kb  # parsed whole: over 100 MB


@pytest.mark.parametrize("indent", [1, 2])
def test_notebook_edit_replace_insert_delete_keep_the_rest_byte_for_byte(ctx, indent):
    nb, text = notebook(markdown("a", ["# A\n", "text é"]), code("b", ["x = 1"], [{"output_type": "stream",
                        "name": "stdout", "text": ["1\n"]}]), markdown("c", ["end"]), indent=indent)
    path = ctx.cwd / "nb.ipynb"
    path.write_text(text)

    def expect(nb: dict) -> None:
        assert path.read_text() == json.dumps(nb, indent=indent, sort_keys=True, ensure_ascii=False) + "\n"

    assert run(ctx, "NotebookEdit", notebook_path="nb.ipynb", cell_id="b", new_source="y = 2\nprint(y)") == \
        "Replaced cell b in nb.ipynb"
    nb["cells"][1].update(source=["y = 2\n", "print(y)"], outputs=[], execution_count=None)
    expect(nb)
    assert run(ctx, "NotebookEdit", notebook_path="nb.ipynb", cell_id="a", new_source="## note",
               cell_type="markdown", edit_mode="insert").startswith("Inserted a markdown cell with id ")
    new = json.loads(path.read_text())["cells"][1]
    nb["cells"].insert(1, {"cell_type": "markdown", "id": new["id"], "metadata": {}, "source": ["## note"]})
    expect(nb)
    assert run(ctx, "NotebookEdit", notebook_path="nb.ipynb", new_source="import os", cell_type="code",
               edit_mode="insert").endswith("at the top in nb.ipynb")
    first = json.loads(path.read_text())["cells"][0]
    nb["cells"].insert(0, {**code(first["id"], ["import os"]), "execution_count": None})
    expect(nb)
    assert run(ctx, "NotebookEdit", notebook_path="nb.ipynb", cell_id="c", new_source="", edit_mode="delete") == \
        "Deleted cell c in nb.ipynb"
    del nb["cells"][-1]
    expect(nb)
    assert run(ctx, "NotebookEdit", notebook_path="nb.ipynb", cell_id="b", new_source="# now text",
               cell_type="markdown") == "Replaced cell b in nb.ipynb"
    nb["cells"][-1] = markdown("b", ["# now text"])
    expect(nb)


def test_notebook_edit_fills_and_empties_a_notebook(ctx):
    nb, text = notebook()
    path = ctx.cwd / "nb.ipynb"
    path.write_text(text)
    assert run(ctx, "NotebookEdit", notebook_path="nb.ipynb", new_source="a\nb", cell_type="code",
               edit_mode="insert").startswith("Inserted a code cell with id")
    nb["cells"] = json.loads(path.read_text())["cells"]
    assert nb["cells"][0]["source"] == ["a\n", "b"]
    assert path.read_text() == json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    run(ctx, "NotebookEdit", notebook_path="nb.ipynb", cell_id="cell-0", new_source="", edit_mode="delete")
    assert path.read_text() == text


def test_notebook_edit_refuses_bad_notebooks_and_unknown_cells(ctx):
    _, text = notebook(markdown("a", ["x"]))
    (ctx.cwd / "nb.ipynb").write_text(text)
    (ctx.cwd / "bad.ipynb").write_text('{"cells": [')
    assert run(ctx, "NotebookEdit", notebook_path="nb.ipynb", cell_id="zz", new_source="y") == \
        "Error: no cell zz; the cells are: a; the file was left as is"
    assert run(ctx, "NotebookEdit", notebook_path="bad.ipynb", cell_id="a", new_source="y") == \
        "Error: bad.ipynb is not a valid notebook (JSON with a cells list); it was left as is"
    assert (ctx.cwd / "nb.ipynb").read_text() == text and (ctx.cwd / "bad.ipynb").read_text() == '{"cells": ['


def test_notebook_edit_writes_through_the_sandbox(ctx, tmp_path):
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    _, text = notebook(markdown("a", ["x"]))
    (outside / "nb.ipynb").write_text(text)
    boxed = ctx._replace(sandbox=agent.Sandbox("workspace-write", (ctx.cwd,), False, None))
    assert "outside the folders this sandbox lets you write" in run(
        boxed, "NotebookEdit", notebook_path=str(outside / "nb.ipynb"), cell_id="a", new_source="y")
    assert (outside / "nb.ipynb").read_text() == text


# --- Background shells ----------------------------------------------------------------------------


def poll(ctx: agent.ToolContext, shell_id: str, until: str, **args) -> str:
    seen = ""
    for _ in range(100):
        seen += run(ctx, "BashOutput", bash_id=shell_id, **args)
        if until in seen:
            return seen
        time.sleep(0.05)
    raise AssertionError(seen)


def test_background_shell_output_filter_kill_and_bounds(ctx):
    ctx = ctx._replace(shells=agent.Shells())
    assert run(ctx, "Bash", command="echo one; echo two; sleep 0.2; echo three", run_in_background=True) == \
        "Started in the background as bash_1. Read its output with BashOutput; end it with KillShell."
    seen = poll(ctx, "bash_1", "[exit code 0]")
    assert seen.count("one") == seen.count("three") == 1  # each read returns only what is new
    run(ctx, "Bash", command="for i in 1 2 3 4; do echo line$i; done; sleep 30", run_in_background=True)
    assert poll(ctx, "bash_2", "line4", filter="line[24]").endswith(
        "line2\nline4\n[2 of 4 new lines matched the filter]\n[running]")
    assert run(ctx, "KillShell", shell_id="bash_2") == "Killed bash_2"
    assert poll(ctx, "bash_2", "killed by signal 9")
    assert run(ctx, "KillShell", shell_id="bash_2") == "bash_2 had already ended (killed by signal 9)"
    assert run(ctx, "BashOutput", bash_id="bash_9") == "Error: no background shell bash_9; shells: bash_1, bash_2"
    assert run(ctx, "BashOutput", bash_id="bash_1", filter="(") .startswith("Error: filter is not a valid regular")
    run(ctx, "Bash", command="seq 1 200000", run_in_background=True)
    while ctx.shells.get("bash_3").exited() is None:
        time.sleep(0.05)
    big = run(ctx, "BashOutput", bash_id="bash_3")
    assert "bytes omitted" in big and big.startswith("1\n2\n") and "200000\n[exit code 0]" in big
    assert len(big) < agent.RESULT_LIMIT


def test_a_shell_that_exited_says_so_while_what_it_left_keeps_writing(ctx):
    """The state is the shell's own process's, asked on every read; the output is read on its own, as it comes."""
    ctx = ctx._replace(shells=agent.Shells())
    run(ctx, "Bash", command="(while :; do echo tick; sleep 0.02; done) & seq 1 3000; exit 3", run_in_background=True)
    seen = poll(ctx, "bash_1", "[exit code 3]")
    assert re.search(r"^3000$", seen, re.MULTILINE) and seen.endswith("[exit code 3]")  # all it wrote, in that read
    later = poll(ctx, "bash_1", "tick")
    assert later.endswith("tick\n[exit code 3]") and not re.search(r"^3000$", later, re.MULTILINE)
    shell = ctx.shells.get("bash_1")
    assert run(ctx, "KillShell", shell_id="bash_1") == "bash_1 had already ended (exit code 3)"
    deadline = time.monotonic() + 10
    while shell.pumping:  # what it left in its group was ended too: nothing holds the output open any more
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_at_most_eight_background_shells_and_all_end_with_solo(ctx):
    shells = agent.Shells()
    ctx = ctx._replace(shells=shells)
    for n in range(agent.SHELLS_AT_ONCE):
        run(ctx, "Bash", command="sleep 60", run_in_background=True)
    assert run(ctx, "Bash", command="sleep 60", run_in_background=True) == \
        "Error: 8 background shells are running already; end one with KillShell"
    pids = [shell.proc.pid for shell in shells.shells.values()]
    shells.close()
    assert all(shell.proc.returncode == -9 for shell in shells.shells.values())
    assert not any(agent.signal_group(pid, 0) for pid in pids)


# --- The to-do list -------------------------------------------------------------------------------


def test_todo_write_keeps_the_list_and_shows_it(ctx):
    events, todos = [], []
    ctx = ctx._replace(emit=events.append, todos=todos)
    items = [{"content": "Run tests", "status": "in_progress", "activeForm": "Running tests"},
             {"content": "Fix bug", "status": "completed", "activeForm": "Fixing bug"},
             {"content": "Ship", "status": "pending", "activeForm": "Shipping"}]
    assert run(ctx, "TodoWrite", todos=json.dumps(items)) == \
        "The to-do list is updated (1 of 3 done). Keep it current as you work."  # a list sent as its JSON text
    assert todos == items and events == [{"type": "todos", "todos": items}]
    assert agent.checklist(todos) == "[>] Running tests\n[x] Fix bug\n[ ] Ship"
    two = [{**item, "status": "in_progress"} for item in items[:2]]
    assert run(ctx, "TodoWrite", todos=two) == "Error: only one todo may be in_progress at a time"
    assert run(ctx, "TodoWrite", todos=[{"content": "x", "status": "done"}]).startswith("Error: each todo is")
    assert todos == items


def test_several_lists_in_one_reply_keep_the_last(ctx):
    events: list = []
    lists = [[{"content": f"step {n}", "status": "pending", "activeForm": "x"}] for n in range(6)]
    message = {"role": "assistant", "content": None, "tool_calls": [call("TodoWrite", {"todos": todos}, id=str(n))
                                                                    for n, todos in enumerate(lists)]}
    conversation = agent.Conversation([{"role": "system", "content": "s"}])
    agent.run_calls(message, TOOLS, ctx._replace(emit=events.append), conversation, lambda event: None, cut=False)
    assert conversation.todos == lists[-1] and [e["todos"] for e in events] == lists


def test_the_list_is_restated_after_compaction():
    conversation = agent.Conversation([{"role": "system", "content": "s"}, {"role": "user", "content": "task"}])
    conversation.todos[:] = [{"content": "Ship", "status": "pending", "activeForm": "Shipping"}]
    compactor = agent.Compactor(lambda body: reply("the summary"), lambda model: {}, lambda event: None)
    assert compactor.compact(agent.Config(api_key="k", cwd=Path("/w")), conversation, 1000, "manual")
    assert conversation[1]["content"].endswith("[Your to-do list (TodoWrite):]\n[ ] Ship")


# --- The web --------------------------------------------------------------------------------------


PAGE = ("<html><head><title>T</title><style>p {color: red}</style><script>alert(1)</script></head><body>"
        "<h1>Install</h1><p>Run <code>pip install x</code>, see <a href='/docs'>the docs</a>.</p>"
        "<ul><li>one</li><li>two</li></ul><ol><li>first</li></ol><pre>a  b\n  c</pre>"
        "<table><tr><th>k</th><th>v</th></tr><tr><td>1</td><td>2</td></tr></table></body></html>")
MARKDOWN = ("# Install\n\nRun `pip install x`, see [the docs](http://h/docs).\n\n- one\n- two\n\n1. first\n\n"
            "```\na  b\n  c\n```\n\n| k | v |\n| --- | --- |\n| 1 | 2 |")


def test_html_becomes_markdown_like_text():
    assert agent.page_text(PAGE, "http://h/page") == MARKDOWN


@pytest.mark.parametrize("charset, text", [
    ("idna", "caf\ufffd \u20ac"), ("punycode", "caf\ufffd \u20ac"), ("unicode_escape", "caf\ufffd \u20ac"),
    ("undefined", "caf\ufffd \u20ac"), ("x-no-such-thing", "caf\ufffd \u20ac"), ("base64", "caf\ufffd \u20ac"),
    ("latin-1", "caf\xe9 \xe2\x82\xac"),
])
def test_a_page_in_a_charset_nobody_decodes_falls_back_to_utf8(charset, text):
    assert agent.page_body(b"caf\xe9 \xe2\x82\xac", f"text/plain; charset={charset}", "http://h/p", False) == text


@pytest.fixture
def site():
    """A local web server: a page, redirects on and off its host, a page over 5 MB, binary data, a slow page."""
    counted: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            port = self.server.server_address[1]
            if self.path.startswith("/count"):  # a page that changes: how many times it was asked for
                counted.append(self.path)
                self.path = "/plain-count"
            routes = {"/page": (200, "text/html; charset=utf-8", PAGE.encode()),
                      "/plain": (200, "text/plain", b"just text"),
                      "/big": (200, "text/plain", b"x" * (6 << 20)),
                      "/binary": (200, "application/octet-stream", bytes(range(256)) * 4),
                      "/missing": (404, "text/html", b"no"),
                      "/plain-count": (200, "text/plain", f"fetched {len(counted)} times".encode()),
                      "/idna": (200, "text/plain; charset=idna", "café ".encode() + b"\xff"),
                      "/utf-7": (200, "text/plain; charset=utf-7", b"caf+AOk- +\xff")}
            if self.path == "/here":
                return self.redirect("/page")
            if self.path == "/away":
                return self.redirect(f"http://localhost:{port}/page")  # another host name for the same server
            if self.path == "/slow":
                time.sleep(1.5)
            if self.path.startswith("/trickle"):  # a byte every 50 ms of a page that says it is 200 bytes long
                return self.trickle()
            status, kind, body = routes.get(self.path, (200, "text/plain", b"late"))
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def trickle(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", "200")
            self.end_headers()
            with contextlib.suppress(OSError):
                for _ in range(200):
                    self.wfile.write(b"t")
                    self.wfile.flush()
                    time.sleep(0.05)

        def redirect(self, where: str) -> None:
            self.send_response(302)
            self.send_header("Location", where)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def reader(asked: list) -> callable:
    """A side request that answers with the page it was given."""
    def side(messages: list[dict], **fields) -> dict:
        asked.append((messages, fields))
        return {"role": "assistant", "content": "ANSWER " + messages[-1]["content"][:60]}
    return side


def test_web_fetch_reads_pages_and_asks_the_model(ctx, site, monkeypatch):
    asked: list = []
    ctx = ctx._replace(side=reader(asked))
    result = run(ctx, "WebFetch", url=f"{site}/here", prompt="How to install?")
    assert result == f'ANSWER <page url="{site}/page">\n# Install\n\nRun `pip'
    assert asked[0][0][0] == {"role": "system", "content": agent.WEB_READER}
    assert asked[0][0][1]["content"].endswith(f"| 1 | 2 |\n</page>\n\nHow to install?")
    assert run(ctx, "WebFetch", url=f"{site}/away", prompt="p") == \
        f"{site}/away redirects to {site.replace('127.0.0.1', 'localhost')}/page, on another host; fetch that URL " \
        "to follow it"
    assert run(ctx, "WebFetch", url=f"{site}/binary", prompt="p") == \
        f"Error: {site}/binary is application/octet-stream (1024 bytes), not a page to read"
    assert run(ctx, "WebFetch", url=f"{site}/missing", prompt="p") == \
        f"Error: {site}/missing answered HTTP 404 Not Found"
    run(ctx, "WebFetch", url=f"{site}/big", prompt="p")
    assert asked[-1][0][1]["content"].count("x") < 110_000 and "[the page was cut at 5242880 bytes]" in \
        asked[-1][0][1]["content"]
    monkeypatch.setattr(agent, "WEB_TIMEOUTS", (1.0, 0.3))
    assert run(ctx, "WebFetch", url=f"{site}/slow", prompt="p").startswith(f"Error: could not fetch {site}/slow:")


def test_web_fetch_ends_at_its_deadline_whatever_the_pacing_alone_or_in_a_batch(ctx, site, monkeypatch):
    """One byte every 50 ms never leaves the connection silent: the deadline (made 1.5 s here) still holds."""
    monkeypatch.setattr(agent, "WEB_SECONDS", 1.5)
    started = time.monotonic()
    result = run(ctx, "WebFetch", url=f"{site}/trickle", prompt="p")
    assert time.monotonic() - started < 1.5 + 2
    assert result.startswith("ttt") and result.endswith("bytes: it took longer than 1.5 s]"), result[-200:]
    calls = [{"id": f"c{n}", "type": "function", "function": {"name": "WebFetch", "arguments": json.dumps(
        {"url": f"{site}/trickle?{n}", "prompt": "p"})}} for n in range(3)]
    started = time.monotonic()
    results = agent.run_batch(calls, {t.name: t for t in agent.TOOLS}, ctx)
    assert time.monotonic() - started < 1.5 + 2 and all("took longer than 1.5 s" in r for r in results), results


def test_web_fetch_reads_a_charset_that_cannot_decode_the_page_as_utf8(ctx, site):
    assert run(ctx, "WebFetch", url=f"{site}/idna", prompt="p") == "café \ufffd"
    assert run(ctx, "WebFetch", url=f"{site}/utf-7", prompt="p").startswith("café")


def test_web_fetch_reuses_a_page_for_15_minutes_and_says_so(ctx, site):
    pages: dict = {}
    ctx = ctx._replace(side=lambda messages, **fields: {"content": messages[-1]["content"]}, pages=pages)
    assert run(ctx, "WebFetch", url=f"{site}/count", prompt="p") == f'<page url="{site}/count">\nfetched 1 times\n' \
                                                                     '</page>\n\np'
    again = run(ctx, "WebFetch", url=f"{site}/count", prompt="other question")
    assert again.startswith(f'<page url="{site}/count">\nfetched 1 times\n</page>\n\nother question\n[the page as '
                            'fetched 0 s ago') and again.endswith(
        " s ago: WebFetch reuses a page for 15 minutes]")  # the page changed meanwhile: the answer says it is a copy
    assert requests.get(f"{site}/count", timeout=5).text == "fetched 2 times"  # one fetch so far, this is the second
    at, final, text = pages[f"{site}/count"]
    pages[f"{site}/count"] = (at - agent.WEB_CACHE_SECONDS, final, text)  # 15 minutes later
    assert "fetched 3 times" in run(ctx, "WebFetch", url=f"{site}/count", prompt="p")
    for n in range(agent.WEB_CACHE_PAGES):
        run(ctx, "WebFetch", url=f"{site}/count?{n}", prompt="p")
    assert len(pages) == agent.WEB_CACHE_PAGES and f"{site}/count" not in pages  # the oldest went first
    anew = run(ctx._replace(pages=None), "WebFetch", url=f"{site}/count", prompt="p")  # no copies kept: fetched
    assert anew.endswith("fetched 20 times\n</page>\n\np")
    assert run(ctx, "WebFetch", url=f"{site}/away", prompt="p") == run(ctx, "WebFetch", url=f"{site}/away",
                                                                          prompt="p").rpartition("\n")[0]


@pytest.mark.parametrize("url, error", [
    ("ftp://example.com/x", "Error: ftp://example.com/x is not an http(s) URL"),
    ("file:///etc/passwd", "Error: file:///etc/passwd is not an http(s) URL"),
])
def test_web_fetch_refuses_other_schemes(ctx, url, error):
    assert run(ctx, "WebFetch", url=url, prompt="p") == error


def test_web_fetch_refused_where_the_sandbox_has_no_network(ctx, site):
    boxed = ctx._replace(sandbox=agent.Sandbox("workspace-write", (ctx.cwd,), False, None), side=reader([]))
    for url in (f"{site}/page", "http://10.0.0.1/", "https://example.com/"):
        assert run(boxed, "WebFetch", url=url, prompt="p") == \
            "Error: the sandbox forbids the network (--sandbox-network off): nothing can be fetched"


def test_web_fetch_upgrades_http_but_on_this_machine():
    ctx = agent.ToolContext(cwd=Path("."), env={})
    assert agent.web_url(ctx, "http://example.com/a?b") == "https://example.com/a?b"
    assert agent.web_url(ctx, "http://localhost:8080/a") == "http://localhost:8080/a"
    assert agent.web_url(ctx, "http://127.0.0.1:1/") == "http://127.0.0.1:1/"


def test_web_search_lists_cited_results_and_filters_domains(ctx):
    asked: list = []
    cites = [{"type": "url_citation", "url_citation": {"url": u, "title": t, "content": c, "start_index": 0,
                                                       "end_index": 1}}
             for u, t, c in [("https://docs.python.org/3/x", "Python docs", "The x module."),
                             ("https://spam.example.com/y", "Spam", "Buy now"),
                             ("https://docs.python.org/3/x", "again", "dup")]]

    def side(messages, **fields):
        asked.append((messages, fields))
        return {"role": "assistant", "content": "summary", "annotations": cites}
    ctx = ctx._replace(side=side)
    assert run(ctx, "WebSearch", query="python x") == (
        "1. Python docs\n   https://docs.python.org/3/x\n   The x module.\n"
        "2. Spam\n   https://spam.example.com/y\n   Buy now")
    assert asked[0] == ([{"role": "user", "content": "python x"}], {"plugins": [{"id": "web", "max_results": 5}]})
    assert run(ctx, "WebSearch", query="q", blocked_domains=["example.com"]).count("\n") == 2
    assert run(ctx, "WebSearch", query="q", allowed_domains='["spam.example.com"]').startswith("1. Spam")
    ctx = ctx._replace(side=lambda messages, **fields: {"role": "assistant", "content": "no idea"})
    assert run(ctx, "WebSearch", query="q") == \
        "Error: the search brought back no results (the server may have no web search)"


def test_web_search_needs_openrouter():
    cfg = agent.Config(api_key="k", cwd=Path("."), base_url="https://api.openai.com/v1", tools=("WebSearch",))
    side = agent.Agent.side.__get__(type("A", (), {"cfg": cfg})())
    with pytest.raises(agent.ToolError, match="web search needs OpenRouter's web plugin, which api.openai.com"):
        side([{"role": "user", "content": "q"}], plugins=[{"id": "web"}])


# --- End to end -----------------------------------------------------------------------------------


def agent_file(base: Path, name: str, text: str) -> None:
    (base / ".claude" / "agents").mkdir(parents=True, exist_ok=True)
    (base / ".claude" / "agents" / f"{name}.md").write_text(text)


def tool_names(body: dict) -> list[str]:
    return [tool["function"]["name"] for tool in body.get("tools", [])]


def test_sub_agents_run_side_by_side_with_their_own_conversations(serve, run, workspace):
    agent_file(workspace, "reviewer", "---\nname: reviewer\ndescription: Reviews code strictly\ntools: Read, Grep\n"
                                      "model: inherit\n---\nYou are a strict reviewer.\n")
    both = threading.Barrier(2, timeout=10)  # the two sub-agents' first requests must be in flight together

    def model(body: dict) -> dict:
        task, last = body["messages"][1]["content"], body["messages"][-1]
        if task == "main task":
            if last["role"] == "user":
                return reply(tool_calls=[
                    call("Agent", {"description": "look around", "prompt": "sub A"}),
                    call("Task", {"description": "review", "prompt": "sub B", "subagent_type": "reviewer"}),
                    call("Agent", {"description": "x", "prompt": "p", "subagent_type": "nope"})])
            return reply(" | ".join(tool_results(body)))
        if last["role"] == "user":
            both.wait()
            if task == "sub A":
                return reply(tool_calls=[call("Glob", {"pattern": "*"})])
        return reply(f"{task} done")

    server = serve(model)
    result = run(["-p", "main task", "--output-format", "json"], cwd=workspace, base_url=server.url)
    out = json.loads(result.stdout)
    assert out["result"] == ("sub A done | sub B done | Error: no agent type nope; types: general-purpose, reviewer")
    assert out["usage"]["requests"] == 5  # the sub-agents' requests count in the run's
    main = server.bodies[0]
    assert "\n- reviewer: Reviews code strictly" in main["tools"][-1]["function"]["description"]
    sub_a = next(b for b in server.bodies if b["messages"][1]["content"] == "sub A")
    sub_b = next(b for b in server.bodies if b["messages"][1]["content"] == "sub B")
    assert "Agent" not in tool_names(sub_a) and "Read" in tool_names(sub_a)  # no sub-agent starts another
    assert tool_names(sub_b) == ["Read", "Grep"]
    assert sub_b["messages"][0]["content"].startswith("You are a strict reviewer.")
    transcript = next((workspace.parent / "home" / ".solo" / "projects").rglob("*.jsonl")).read_text().splitlines()
    chains = {json.loads(line).get("agent") for line in transcript if '"sidechain"' in line}
    assert chains == {"general-purpose: look around", "reviewer: review"}
    main_lines = [json.loads(line) for line in transcript[1:] if '"sidechain"' not in line]
    assert [m["role"] for m in main_lines if "role" in m] == ["system", "user", "assistant", "tool", "tool", "tool",
                                                              "assistant"]


@pytest.mark.parametrize("status, ends", [(400, False), (500, False), (401, True), (402, True)])
def test_a_sub_agents_api_failure_is_its_agent_calls_result(serve, run, workspace, status, ends):
    """The sibling finishes and the parent model decides; only the key or the credit (401, 402) ends the run."""
    def model(body: dict) -> Any:
        task, last = body["messages"][1]["content"], body["messages"][-1]
        if task == "main task":
            if last["role"] == "user":
                return reply(tool_calls=[call("Agent", {"description": "fails", "prompt": "sub A"}),
                                         call("Agent", {"description": "works", "prompt": "sub B"})])
            return reply(" | ".join(tool_results(body)))
        if task == "sub A":
            return Raw(status, {"error": {"code": status, "message": f"refused with {status}"}})
        time.sleep(0.5)  # still at work when its sibling fails
        return reply("sub B done")

    server = serve(model)
    result = run(["-p", "main task"], cwd=workspace, base_url=server.url, env={"SOLO_MAX_ATTEMPTS": "2"})
    if ends:
        assert result.code == 1 and f"refused with {status}" in result.stderr
        return
    assert result.code == 0, result.stderr
    assert result.stdout.startswith(f"Error: the sub-agent failed: HTTP {status}: refused with {status}")
    assert result.stdout.rstrip().endswith(" | sub B done")


def test_plan_mode_gives_sub_agents_read_only_tools(serve, run, workspace):
    def model(body: dict) -> dict:
        if body["messages"][1]["content"].startswith("plan it") and body["messages"][-1]["role"] == "user":
            return reply(tool_calls=[call("Agent", {"description": "d", "prompt": "sub"})])
        return reply("done")
    server = serve(model)
    assert run(["-p", "plan it", "--permission-mode", "plan"], cwd=workspace, base_url=server.url).code == 0
    sub = next(b for b in server.bodies if b["messages"][1]["content"] == "sub")
    assert set(tool_names(sub)) == {"Read", "Glob", "Grep", "BashOutput", "WebFetch", "WebSearch", "TodoWrite"}
    assert tool_names(server.bodies[0])[-1] == "Agent" and "KillShell" not in tool_names(server.bodies[0])


def test_web_fetch_and_search_end_to_end_count_their_usage(serve, run, workspace, site):
    cite = {"type": "url_citation", "url_citation": {"url": "https://example.org/a", "title": "Example",
                                                     "content": "An example page.", "start_index": 0, "end_index": 5}}

    def model(body: dict) -> dict:
        if body["messages"][0]["content"] == agent.WEB_READER:
            assert body["messages"][1]["content"].startswith(f'<page url="{site}/page">\n# Install')
            return reply("It says: pip install x")
        if body.get("plugins"):
            return reply("found", annotations=[cite])
        if body["messages"][-1]["role"] == "user":
            return reply(tool_calls=[call("WebFetch", {"url": f"{site}/page", "prompt": "How?"}),
                                     call("WebSearch", {"query": "example"})])
        return reply("\n".join(tool_results(body)))

    server = serve(model)
    result = run(["-p", "go", "--output-format", "json"], cwd=workspace, base_url=server.url)
    out = json.loads(result.stdout)
    assert out["result"] == "It says: pip install x\n1. Example\n   https://example.org/a\n   An example page."
    assert out["usage"]["requests"] == 4
    assert "stream" not in next(b for b in server.bodies if b.get("plugins"))


def test_images_reach_the_request_body_and_a_blind_model_is_told(serve, run, workspace):
    (workspace / "shot.png").write_bytes(png(2, 3))
    (workspace / "photo.jpeg").write_bytes(jpeg(8, 6))
    script = [call("Read", {"file_path": "shot.png"}), call("Read", {"file_path": "photo.jpeg"})]
    text_only = [{"id": "anthropic/claude-haiku-4.5", "architecture": {"input_modalities": ["text"]}}]
    for models in (None, text_only):
        server = serve(lambda body: reply(tool_calls=script) if body["messages"][-1]["role"] == "user"
                       and isinstance(body["messages"][-1]["content"], str) else reply("seen"), models=models)
        assert run(["-p", "look"], cwd=workspace, base_url=server.url).code == 0
        messages = server.bodies[1]["messages"]
        if models is None:
            assert [m["role"] for m in messages[-3:]] == ["tool", "tool", "user"]
            urls = [p["image_url"]["url"][:22] for p in messages[-1]["content"] if p["type"] == "image_url"]
            assert urls == ["data:image/png;base64,", "data:image/jpeg;base64"]
            assert messages[-3]["content"].startswith("[shot.png: PNG image, 2x3 pixels")
        else:
            assert messages[-1]["content"] == "Error: the model anthropic/claude-haiku-4.5 cannot take images " \
                                              "(OpenRouter's model list gives it no image input)"


def test_a_refused_image_costs_only_that_image_in_this_run_and_the_next(serve, run, workspace):
    (workspace / "odd.png").write_bytes(png(2, 3))

    def model(body: dict) -> dict:
        if any(isinstance(m["content"], list) and any(p["type"] == "image_url" for p in m["content"])
               for m in body["messages"]):
            return Raw(400, {"error": {"code": 400, "message": "Could not process image"}})
        if body["messages"][-1]["role"] == "user" and "look" in str(body["messages"][-1]["content"]):
            return reply(tool_calls=[call("Read", {"file_path": "odd.png"})])
        return reply("done")

    server = serve(model)
    first = run(["-p", "look"], cwd=workspace, base_url=server.url)
    assert first.code == 0 and first.stdout == "done\n", first.stderr
    assert "the provider refused a request carrying 1 image (HTTP 400: Could not process image)" in first.stderr
    assert len(server.bodies) == 3  # the prompt, the refused request, the same without its image
    note = server.bodies[2]["messages"][-1]["content"]
    assert note[1] == {"type": "text", "text": "[an image was here; it was taken out because the provider refused "
                                               "the request that carried it (HTTP 400: Could not process image)]"}
    again = run(["-c", "-p", "and now?"], cwd=workspace, base_url=server.url)
    assert again.code == 0 and again.stdout == "done\n", again.stderr
    assert len(server.bodies) == 4 and note in [m["content"] for m in server.bodies[3]["messages"]]


def test_a_request_refused_without_images_is_not_sent_again(serve, run, workspace):
    server = serve(lambda body: Raw(400, {"error": {"code": 400, "message": "Bad request"}}))
    result = run(["-p", "hi"], cwd=workspace, base_url=server.url)
    assert result.code == 1 and "HTTP 400: Bad request" in result.stderr and len(server.bodies) == 1


def test_the_first_request_with_every_tool_stays_under_9_kb(serve, run, workspace):
    skill = workspace / ".claude" / "skills" / "deploy"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: deploy\ndescription: Deploys the app\n---\nRun make deploy.\n")
    server = serve(lambda body: reply("ok"))
    assert run(["-p", "hi"], cwd=workspace, base_url=server.url).code == 0
    assert set(tool_names(server.bodies[0])) == set(agent.TOOL_NAMES)
    assert len(server.raw[0]) < 9_000, len(server.raw[0])


def test_background_shells_end_when_solo_exits(serve, run, workspace):
    script = [call("Bash", {"command": "sleep 60 & echo $! > pid; wait", "run_in_background": True})]
    server = serve(lambda body: reply(tool_calls=script) if body["messages"][-1]["role"] == "user" else reply("ok"))
    assert run(["-p", "serve"], cwd=workspace, base_url=server.url).code == 0
    assert "as bash_1" in server.bodies[1]["messages"][-1]["content"]
    pid = int((workspace / "pid").read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_a_session_draws_the_list_lists_agents_and_shells_and_attaches_pasted_images(serve, terminal, workspace):
    (workspace / "shot.png").write_bytes(png(4, 4))
    todos = [{"content": "Run tests", "status": "in_progress", "activeForm": "Running tests"},
             {"content": "Ship", "status": "pending", "activeForm": "Shipping"}]

    def model(body: dict) -> dict:
        last = body["messages"][-1]
        if last["role"] == "user" and last["content"] == "plan":
            return reply(tool_calls=[call("TodoWrite", {"todos": todos})])
        return reply("done")

    server = serve(model)
    term = terminal(server)
    term.send("plan\r")
    assert "[>] Running tests\n[ ] Ship" in term.expect("done").replace("\r", "")
    term.expect(r"(?:^|\n)> ")
    term.ask("/agents", "general-purpose: researches")
    term.ask("/bashes", "no background shells")
    term.ask("what is in shot.png", "done")
    content = server.bodies[-1]["messages"][-1]["content"]
    assert content[0] == {"type": "text", "text": "what is in shot.png"} and content[1]["type"] == "image_url"
    term.send("\x04")
    assert term.wait() == 0


def todo_script(body: dict) -> dict:
    """A plan: the list, the list again at once, a command, the list once more, the answer."""
    lists = [[{"content": "Run the whole test suite slowly", "status": "in_progress",
               "activeForm": "Running the whole test suite slowly"}, {"content": "Ship", "status": "pending",
                                                                      "activeForm": "Shipping"}],
             [{"content": "Run tests", "status": "completed", "activeForm": "Running tests"},
              {"content": "Ship", "status": "in_progress", "activeForm": "Shipping it"}],
             None, [{"content": "Run tests", "status": "completed", "activeForm": "Running tests"},
                    {"content": "Ship", "status": "completed", "activeForm": "Shipping"}]]
    step = sum(m["role"] == "tool" for m in body["messages"])
    if step == 2:
        return reply(tool_calls=[call("Bash", {"command": "echo between"})])
    return reply(tool_calls=[call("TodoWrite", {"todos": lists[step]})]) if step < 4 else reply("done")


@pytest.mark.parametrize("colour", [True, False])
def test_the_to_do_list_is_redrawn_in_place_until_something_comes_below_it(serve, terminal, colour):
    server = serve(todo_script)
    env = {**os.environ, "OPENROUTER_BASE_URL": server.url, "OPENROUTER_API_KEY": "k", **({} if colour else {
        "NO_COLOR": "1"})}
    term = terminal(server, "--yes", term="xterm", env=env)
    fcntl.ioctl(term.master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 30, 0, 0))  # 30 columns: lines wrap
    term.send("plan\r")
    term.expect("done")
    screen = term.transcript
    drawings = [m.start() for m in re.finditer("To-do list", screen)]
    assert len(drawings) == 3 and "● TodoWrite" not in screen  # the list is the call's line
    over = r"\x1b\[\d+A\r\x1b\[J"  # up over the list, then clear it (the status line is cleared in its place)
    assert screen.count("\x1b[4A\r\x1b[J") == colour and len(re.findall(over, screen)) == colour  # the first only
    assert bool(re.search(over, screen[drawings[0]: drawings[1]])) == colour
    assert "Shipping it" in screen[drawings[1]:] and screen.index("between") < drawings[2]  # drawn below, not over
    if colour:  # 4 rows: the head, a line that wraps at 30 columns, one more
        assert re.search(r"\[>\] Running the whole test suite slowly.*\r\n.*\[ \] Ship", screen)
    term.expect(r"(?:^|\n|\x1b\[K)> ")
    term.send("\x04")
    assert term.wait() == 0


def test_the_drawn_list_is_bounded_made_visible_and_its_rows_counted():
    todos = [{"content": f"item {n}", "status": "completed", "activeForm": "x"} for n in range(200)]
    todos[150] = {"content": "evil\x1b[2J\nline", "status": "in_progress", "activeForm": "doing \x1b[2J" + "y" * 900}
    lines = agent.todo_lines(todos, 5)
    assert lines[0] == "… 149 completed" and lines[-1] == "… +46 more" and len(lines) == 7
    assert lines[2].startswith("[>] doing \\x1b[2Jyyy") and len(lines[2]) == 500 and "\x1b" not in "".join(lines)
    assert agent.todo_lines([], 5) == ["(no items)"]
    many = [{"content": "first\n" * 1000, "status": "pending", "activeForm": "x"},
            {"content": "fake\n[>] item\r\n", "status": "completed", "activeForm": "x"}]  # line breaks: one line each
    assert agent.todo_lines(many, 5) == ["[ ] " + " ".join(["first"] * 1000)[:493] + "...", "[x] fake [>] item\\r"]
    assert [agent.rows_of(text, 10) for text in ("", "x" * 10, "x" * 11, "\033[1mbold\033[0m", "漢字" * 3)] == \
        [1, 1, 2, 1, 2]


def test_sub_agents_in_a_session_ask_one_question_at_a_time(serve, terminal, workspace):
    def model(body: dict) -> dict:
        task, last = body["messages"][1]["content"], body["messages"][-1]
        if task == "two" and last["role"] == "user":
            return reply(tool_calls=[call("Agent", {"description": d, "prompt": d}) for d in ("left", "right")])
        if task in ("left", "right") and last["role"] == "user":
            return reply(tool_calls=[call("Bash", {"command": f"echo {task} > {task}.txt"})])
        return reply(f"{task} done")

    server = serve(model)
    term = terminal(server)
    term.send("two\r")
    for _ in range(2):
        term.expect(r"Allow Bash\? \[y/n/a/s\] ")
        term.send("y\r")
    term.expect("two done")
    term.expect(r"\n> ")
    assert term.transcript.count("left done") <= 1  # as the Agent call's result only: sub-agents' text is not drawn
    assert (workspace / "left.txt").read_text() == "left\n" and (workspace / "right.txt").read_text() == "right\n"
    term.send("\x04")
    assert term.wait() == 0


def test_a_resumed_session_has_its_to_do_list_back(tmp_path):
    cfg = agent.Config(api_key="k", cwd=tmp_path, solo_home=tmp_path / "solo", session_id=agent.new_uuid(),
                       tools=agent.TOOL_NAMES)
    first = agent.Agent(cfg, {}, lambda event: None)
    conversation = first.conversation()
    todos = [{"content": "Ship", "status": "pending", "activeForm": "Shipping"}]
    conversation.append({"role": "user", "content": "plan"})
    conversation.append({"role": "assistant", "content": None, "tool_calls": [call("TodoWrite", {"todos": todos})]})
    conversation.transcript.close()
    path = next((tmp_path / "solo").rglob("*.jsonl"))
    second = agent.Agent(cfg, {}, lambda event: None)
    assert second.conversation(path).todos == todos


def test_a_sub_agent_of_a_cancelled_prompt_stops_at_its_next_step(serve, tmp_path):
    go = threading.Event()

    def model(body: dict) -> dict:
        if body["messages"][-1]["role"] == "user":
            go.wait(10)
            return reply(tool_calls=[call("Glob", {"pattern": "*"})])
        return reply("finished")

    server = serve(model)
    cfg = agent.Config(api_key="k", cwd=tmp_path, base_url=server.url, tools=agent.TOOL_NAMES, persist=False)
    runner = agent.Agent(cfg, {}, lambda event: None)
    outcome: list[str] = []
    thread = threading.Thread(target=lambda: outcome.append(run(runner.ctx, "Agent", description="d", prompt="p")))
    thread.start()
    while not server.bodies:
        time.sleep(0.02)
    runner.turns += 1  # what Agent.ask does when its prompt ends, cancelled or not
    go.set()
    thread.join(10)
    assert outcome == ["Error: the prompt that started this sub-agent was cancelled"] and len(server.bodies) == 1


# --- Rules and hooks ------------------------------------------------------------------------------


def test_web_fetch_domain_rules_and_hooks_cover_the_new_tools(serve, run, workspace, site):
    log = workspace.parent / "hooked.jsonl"
    hook = {"type": "command", "command": f"cat >> {log}; echo >> {log}"}
    settings = workspace.parent / "home" / ".claude" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"permissions": {"deny": ["WebFetch(domain:localhost)"]}, "hooks": {
        "PreToolUse": [{"matcher": "WebFetch|TodoWrite|Agent", "hooks": [hook]}],
        "SubagentStop": [{"hooks": [hook]}]}}))
    other = site.replace("127.0.0.1", "localhost")
    todo = [{"content": "Read", "status": "in_progress", "activeForm": "Reading"}]

    def model(body: dict) -> dict:
        if body["messages"][0]["content"] == agent.WEB_READER:
            return reply("read it")
        if body["messages"][1]["content"] == "sub":
            return reply("sub done")
        if body["messages"][-1]["role"] == "user":
            return reply(tool_calls=[call("WebFetch", {"url": f"{site}/page", "prompt": "p"}),
                                     call("WebFetch", {"url": f"{other}/page", "prompt": "p"}),
                                     call("TodoWrite", {"todos": todo}),
                                     call("Agent", {"description": "d", "prompt": "sub"})])
        return reply(" | ".join(tool_results(body)))

    server = serve(model)
    result = run(["-p", "go"], cwd=workspace, base_url=server.url)
    assert result.stdout.strip() == (f"read it | Error: permission denied by WebFetch(domain:localhost) ({settings}) | "
                                     "The to-do list is updated (0 of 1 done). Keep it current as you work. | sub done")
    seen = [json.loads(line) for line in log.read_text().splitlines() if line]
    assert [e.get("tool_name") or e["hook_event_name"] for e in seen] == \
        ["WebFetch", "WebFetch", "TodoWrite", "Agent", "SubagentStop"]


def test_a_session_asks_before_the_first_fetch_of_a_domain(serve, terminal, workspace, site):
    other = site.replace("127.0.0.1", "localhost")
    urls = {"one": f"{site}/page", "two": f"{site}/plain", "three": f"{other}/page"}

    def model(body: dict) -> dict:
        if body["messages"][0]["content"] == agent.WEB_READER:
            return reply("read it")
        last = body["messages"][-1]
        if last["role"] == "user":
            return reply(tool_calls=[call("WebFetch", {"url": urls[last["content"]], "prompt": "p"})])
        return reply("said: " + tool_results(body)[0])

    server = serve(model)
    term = terminal(server)
    term.send("one\r")
    assert "a: allow WebFetch(domain:127.0.0.1) for this session" in term.expect(r"Allow WebFetch\? \[y/n/a\] ")
    term.send("a\r")
    term.expect("said: read it")
    term.expect(r"\n> ")
    term.ask("two", "said: read it")  # the same domain: no question
    term.send("three\r")
    term.expect(r"Allow WebFetch\? \[y/n/a\] ")
    term.send("n\r")
    term.expect("said: Error: permission denied: the user declined to let WebFetch run")
    assert term.transcript.count("Allow WebFetch?") == 2
    term.expect(r"\n> ")
    term.send("\x04")
    assert term.wait() == 0
