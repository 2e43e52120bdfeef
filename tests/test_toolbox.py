"""The rest of Claude Code's toolbox: images and notebooks in Read, NotebookEdit, background shells, TodoWrite,
WebFetch, WebSearch and sub-agents (Agent); in process against real files and a local HTTP server, then end to
end against the fake OpenRouter."""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from app import main as agent
from tests.fake_openrouter import call, reply, tool_results

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
    image = {"output_type": "display_data", "data": {"image/png": "iVBORw0K\n", "text/plain": ["<Figure>"]},
             "metadata": {}}
    _, text = notebook(markdown("intro", ["# Title\n", "Some text"]),
                       code("run", ["print('x' * 5000)"], [{"output_type": "stream", "name": "stdout",
                                                           "text": ["x" * 5000 + "\n"]}, image]))
    (ctx.cwd / "nb.ipynb").write_text(text)
    result = run(ctx, "Read", file_path="nb.ipynb")
    assert result.startswith('<cell id="intro" type="markdown">\n# Title\nSome text\n</cell>\n'
                             '<cell id="run" type="code" execution_count=1>\nprint(')
    assert "characters omitted" in result and len(result) < 3000
    assert result.parts == ({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}},)


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
    while ctx.shells.get("bash_3").code is None:
        time.sleep(0.05)
    big = run(ctx, "BashOutput", bash_id="bash_3")
    assert "bytes omitted" in big and big.startswith("1\n2\n") and "200000\n[exit code 0]" in big
    assert len(big) < agent.RESULT_LIMIT


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


def test_the_list_is_restated_after_compaction():
    conversation = agent.Conversation([{"role": "system", "content": "s"}, {"role": "user", "content": "task"}])
    conversation.todos[:] = [{"content": "Ship", "status": "pending", "activeForm": "Shipping"}]
    compactor = agent.Compactor(lambda body: reply("the summary"), lambda model: {}, lambda event: None)
    assert compactor.compact(agent.Config(api_key="k", cwd=Path("/w")), conversation, 1000, "manual")
    assert conversation[1]["content"].endswith("[Your to-do list (TodoWrite):]\n[ ] Ship")
