"""Each tool for real in tmp_path: real files, a real shell, real (short) timeouts."""

from __future__ import annotations

import os
import stat
import time

import pytest

from app import main as agent

run = agent.run_tool_call
TOOLS = {tool.name: tool for tool in agent.TOOLS}


def call_tool(ctx, name: str, **args) -> str:
    """Run a tool through the dispatcher, as the model would."""
    import json
    return run({"id": "c1", "function": {"name": name, "arguments": json.dumps(args)}}, TOOLS, ctx)


# --- Read -----------------------------------------------------------------------------------------


def test_read_returns_content_exactly(ctx, tmp_path):
    text = "line one\n  indented\ttab\n\nünïcödé ✓\nno newline at end"
    (tmp_path / "f.txt").write_text(text, encoding="utf-8")
    assert call_tool(ctx, "Read", file_path="f.txt") == text


def test_read_window_says_where_it_goes_on(ctx, tmp_path):
    (tmp_path / "f.txt").write_text("".join(f"{i}\n" for i in range(1, 11)))
    out = call_tool(ctx, "Read", file_path="f.txt", offset=3, limit=4)
    assert out.startswith("3\n4\n5\n6\n")
    assert "[Showing lines 3-6 of 10. Use offset=7 to read on.]" in out


def test_read_default_window_is_2000_lines(ctx, tmp_path):
    (tmp_path / "f.txt").write_text("".join(f"{i}\n" for i in range(1, 2501)))
    out = call_tool(ctx, "Read", file_path="f.txt")
    assert "1999\n2000\n" in out and "\n2001\n" not in out
    assert "of 2500. Use offset=2001" in out


def test_read_counts_a_last_line_without_newline(ctx, tmp_path):
    (tmp_path / "f.txt").write_text("a\nb\nc")
    assert "of 3." in call_tool(ctx, "Read", file_path="f.txt", limit=1)


def test_read_cuts_long_lines_and_bounds_the_result(ctx, tmp_path):
    (tmp_path / "f.txt").write_text(("x" * 5000 + "\n") * 100)
    out = call_tool(ctx, "Read", file_path="f.txt")
    assert "[line cut at 2000 characters]" in out
    assert len(out) <= agent.READ_LIMIT + 200
    assert "Use offset=" in out


def test_read_a_huge_single_line_stays_bounded(ctx, tmp_path):
    with open(tmp_path / "big.txt", "wb") as f:
        f.write(b"y" * 30_000_000)
    out = call_tool(ctx, "Read", file_path="big.txt")
    assert len(out) < 3000 and "[line cut at 2000 characters]" in out


@pytest.mark.parametrize("make, expected", [
    (lambda p: None, "Error: file not found: nope.txt (working directory: "),
    (lambda p: (p / "nope.txt").mkdir(), "Error: nope.txt is a directory"),
    (lambda p: (p / "nope.txt").write_bytes(b"\x7fELF\x00\x01\x02" * 100), "Error: nope.txt is a binary file"),
    (lambda p: (p / "nope.txt").write_bytes(bytes(range(1, 32)) * 50), "Error: nope.txt is a binary file"),
    (lambda p: (p / "nope.txt").write_text(""), "(the file nope.txt is empty)"),
    (lambda p: (p / "nope.txt").write_text("a\nb\n"), "Error: offset 9 is past the end of nope.txt (2 lines)"),
])
def test_read_errors(ctx, tmp_path, make, expected):
    make(tmp_path)
    offset = 9 if expected.startswith("Error: offset") else 1
    assert call_tool(ctx, "Read", file_path="nope.txt", offset=offset).startswith(expected)


def test_read_missing_file_suggests_close_names(ctx, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.yaml").write_text("x")
    out = call_tool(ctx, "Read", file_path="src/confg.yaml")
    assert str(tmp_path) in out and "Did you mean: src/config.yaml" in out


def test_read_absolute_path(ctx, tmp_path):
    (tmp_path / "a.txt").write_text("abs")
    assert call_tool(ctx, "Read", file_path=str(tmp_path / "a.txt")) == "abs"


# --- Write ----------------------------------------------------------------------------------------


def test_write_creates_parents_and_says_created(ctx, tmp_path):
    out = call_tool(ctx, "Write", file_path="a/b/c.txt", content="hi\nthere\n")
    assert out == "Created a/b/c.txt (9 bytes, 2 lines)"
    assert (tmp_path / "a/b/c.txt").read_text() == "hi\nthere\n"


def test_write_updates_and_keeps_permissions(ctx, tmp_path):
    target = tmp_path / "run.sh"
    target.write_text("old")
    target.chmod(0o751)
    assert call_tool(ctx, "Write", file_path="run.sh", content="new").startswith("Updated run.sh")
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o751
    assert [p.name for p in tmp_path.iterdir()] == ["run.sh"]  # no temp file left behind


def test_write_through_a_symlink_keeps_the_link(ctx, tmp_path):
    (tmp_path / "real.txt").write_text("old")
    (tmp_path / "link.txt").symlink_to("real.txt")
    call_tool(ctx, "Write", file_path="link.txt", content="new")
    assert (tmp_path / "link.txt").is_symlink() and (tmp_path / "real.txt").read_text() == "new"


@pytest.mark.parametrize("setup, path, expected", [
    (lambda p: (p / "d").mkdir(), "d", "Error: d is a directory"),
    (lambda p: (p / "f").write_text("keep"), "f/child.txt", "Error: cannot create f/child.txt: a parent"),
])
def test_write_refuses_unwritable_paths_and_touches_nothing(ctx, tmp_path, setup, path, expected):
    setup(tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert call_tool(ctx, "Write", file_path=path, content="x").startswith(expected)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    if (tmp_path / "f").is_file():
        assert (tmp_path / "f").read_text() == "keep"


def test_write_accepts_a_json_object_as_content(ctx, tmp_path):
    import json
    raw = json.dumps({"file_path": "cfg.json", "content": {"a": 1}})
    out = run({"id": "c", "function": {"name": "Write", "arguments": raw}}, TOOLS, ctx)
    assert out.startswith("Created") and json.loads((tmp_path / "cfg.json").read_text()) == {"a": 1}


# --- Edit -----------------------------------------------------------------------------------------


def test_edit_replaces_a_unique_string(ctx, tmp_path):
    (tmp_path / "m.py").write_text("a = 1\nb = 2\n")
    assert call_tool(ctx, "Edit", file_path="m.py", old_string="b = 2", new_string="b = 3") == \
        "Edited m.py: replaced 1 occurrence"
    assert (tmp_path / "m.py").read_text() == "a = 1\nb = 3\n"


def test_edit_replace_all(ctx, tmp_path):
    (tmp_path / "m.py").write_text("x x x")
    assert "replaced 3 occurrences" in call_tool(ctx, "Edit", file_path="m.py", old_string="x",
                                                 new_string="y", replace_all="true")
    assert (tmp_path / "m.py").read_text() == "y y y"


def test_edit_keeps_crlf_line_endings(ctx, tmp_path):
    (tmp_path / "w.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    call_tool(ctx, "Edit", file_path="w.txt", old_string="one\ntwo", new_string="uno\ndos")
    assert (tmp_path / "w.txt").read_bytes() == b"uno\r\ndos\r\nthree\r\n"


@pytest.mark.parametrize("content, old, new, expected", [
    (b"abc\n", "zzz", "y", "Error: old_string was not found in f.txt"),
    (b"ab ab\n", "ab", "cd", "Error: old_string was found 2 times in f.txt"),
    (b"abc\n", "abc", "abc", "Error: old_string and new_string are the same"),
    (b"abc\n", "", "x", "Error: old_string is empty"),
    (b"caf\xe9 latin-1\n", "caf", "\u20ac", "Error: f.txt is latin-1 text and the new text has characters"),
    (b"a\x00b", "a", "c", "Error: f.txt is a binary file"),
])
def test_edit_errors_leave_the_file_untouched(ctx, tmp_path, content, old, new, expected):
    (tmp_path / "f.txt").write_bytes(content)
    assert call_tool(ctx, "Edit", file_path="f.txt", old_string=old, new_string=new).startswith(expected)
    assert (tmp_path / "f.txt").read_bytes() == content


def test_edit_missing_file(ctx):
    assert call_tool(ctx, "Edit", file_path="gone.py", old_string="a", new_string="b").startswith(
        "Error: file not found: gone.py")


# --- Bash -----------------------------------------------------------------------------------------


def test_bash_runs_in_the_working_directory_with_exit_code(ctx, tmp_path):
    out = call_tool(ctx, "Bash", command="pwd; echo oops >&2; exit 4")
    assert out == f"{tmp_path}\noops\n[exit code 4]"


def test_bash_stdin_is_closed(ctx):
    assert call_tool(ctx, "Bash", command="cat; echo done") == "done\n[exit code 0]"


def test_bash_no_output(ctx):
    assert call_tool(ctx, "Bash", command="true") == "(no output)\n[exit code 0]"


def test_bash_timeout_kills_the_whole_group_and_keeps_partial_output(ctx, tmp_path):
    started = time.monotonic()
    out = call_tool(ctx, "Bash", command="echo started; (sleep 30; touch late) & sleep 30", timeout=1000)
    assert time.monotonic() - started < 5
    assert out.startswith("started\n") and "[timed out after 1000 ms" in out
    time.sleep(0.2)
    assert not (tmp_path / "late").exists()


def test_bash_returns_while_background_processes_hold_the_output(ctx):
    started = time.monotonic()
    out = call_tool(ctx, "Bash", command="sleep 5 & echo launched")
    assert time.monotonic() - started < 3
    assert "launched" in out and "background processes are still running" in out and "[exit code 0]" in out


def test_bash_huge_output_keeps_head_and_tail(ctx):
    out = call_tool(ctx, "Bash", command="seq 1 2000000")
    assert len(out) <= agent.RESULT_LIMIT + 200
    assert out.startswith("1\n2\n3\n") and "2000000\n[exit code 0]" in out
    assert "bytes omitted ...]" in out


def test_bash_timeout_is_coerced_and_clamped(ctx):
    assert call_tool(ctx, "Bash", command="echo ok", timeout="5000") == "ok\n[exit code 0]"
    assert call_tool(ctx, "Bash", command="echo ok", timeout=99_999_999) == "ok\n[exit code 0]"


def test_bash_never_sees_secrets(tmp_path):
    env = {"PATH": os.environ["PATH"], "OPENROUTER_API_KEY": "k1", "GITHUB_TOKEN": "t", "DB_PASSWORD": "p",
           "AWS_SECRET_ACCESS_KEY": "s", "MY_API_KEY": "m", "HOME": str(tmp_path)}
    ctx = agent.ToolContext(cwd=tmp_path, env=agent.command_env(env, ("MY_API_KEY", "OPENROUTER_API_KEY")))
    out = call_tool(ctx, "Bash", command="env")
    assert "HOME=" in out and "MY_API_KEY=m" in out
    for hidden in ("OPENROUTER_API_KEY", "GITHUB_TOKEN", "DB_PASSWORD", "AWS_SECRET"):
        assert hidden not in out


# --- Glob -----------------------------------------------------------------------------------------


def test_glob_newest_first_skipping_git(ctx, tmp_path):
    for i, name in enumerate(["old.py", "sub/mid.py", "new.py", ".git/hooks/x.py", "notes.txt"]):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
    assert call_tool(ctx, "Glob", pattern="**/*.py") == "new.py\nsub/mid.py\nold.py"
    assert call_tool(ctx, "Glob", pattern="*.py", path="sub") == "sub/mid.py"
    assert call_tool(ctx, "Glob", pattern="*.rs") == "No files found"


def test_glob_caps_the_list(ctx, tmp_path):
    for i in range(150):
        (tmp_path / f"f{i}.txt").write_text("x")
    out = call_tool(ctx, "Glob", pattern="*.txt")
    assert len(out.splitlines()) == 101 and "[50 more files not shown" in out


def test_glob_missing_path(ctx):
    assert call_tool(ctx, "Glob", pattern="*", path="nowhere").startswith("Error: file not found: nowhere")


# --- Grep -----------------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "a.py").write_text("import os\ndef main():\n    return os.getcwd()\n")
    (tmp_path / "b.txt").write_text("Main street\nnothing\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.py").write_text("# main entry\nx = 1\ny = 2\nz = main\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("main")
    (tmp_path / "bin.dat").write_bytes(b"main\x00\x01")
    return tmp_path


@pytest.mark.parametrize("args, expected", [
    ({"pattern": "main"}, {"a.py", "sub/c.py"}),
    ({"pattern": "main", "-i": True}, {"a.py", "b.txt", "sub/c.py"}),
    ({"pattern": "main", "glob": "*.txt", "-i": "true"}, {"b.txt"}),
    ({"pattern": "main", "glob": "*.{py,txt}", "-i": True}, {"a.py", "b.txt", "sub/c.py"}),
    ({"pattern": "main", "path": "sub"}, {"sub/c.py"}),
    ({"pattern": "zzz"}, {"No matches found"}),
])
def test_grep_files_with_matches(ctx, tree, args, expected):
    assert set(call_tool(ctx, "Grep", **args).splitlines()) == expected


def test_grep_content_with_context_and_numbers(ctx, tree):
    out = call_tool(ctx, "Grep", pattern="^z", path="sub/c.py", output_mode="content", **{"-B": 1})
    assert out == "sub/c.py-3-y = 2\nsub/c.py:4:z = main"
    out = call_tool(ctx, "Grep", pattern="main", path="sub", output_mode="content", **{"-n": False})
    assert out == "sub/c.py:# main entry\nsub/c.py:z = main"
    out = call_tool(ctx, "Grep", pattern="main", path="sub", output_mode="content", **{"-A": 1})
    assert out == "sub/c.py:1:# main entry\nsub/c.py-2-x = 1\n--\nsub/c.py:4:z = main"


def test_grep_count_and_head_limit(ctx, tree):
    assert call_tool(ctx, "Grep", pattern="=", output_mode="count", path="sub") == "sub/c.py:3"
    out = call_tool(ctx, "Grep", pattern=".", output_mode="content", path="sub", head_limit=2)
    assert out.splitlines()[:2] == ["sub/c.py:1:# main entry", "sub/c.py:2:x = 1"]
    assert "more results not shown" in out


@pytest.mark.parametrize("args, expected", [
    ({"pattern": "("}, "Error: invalid regular expression '('"),
    ({"pattern": "x", "output_mode": "lines"}, "Error: output_mode must be"),
    ({"pattern": "x", "path": "missing"}, "Error: file not found: missing"),
])
def test_grep_errors(ctx, tree, args, expected):
    assert call_tool(ctx, "Grep", **args).startswith(expected)


def test_grep_output_is_bounded(ctx, tmp_path):
    (tmp_path / "big.txt").write_text("match me\n" * 200_000)
    out = call_tool(ctx, "Grep", pattern="match", output_mode="content")
    assert len(out) < agent.RESULT_LIMIT and "more results not shown" in out


def test_fifos_are_refused_or_skipped_never_waited_on(ctx, tmp_path):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "a.txt").write_text("needle")
    assert call_tool(ctx, "Read", file_path="pipe") == "Error: pipe is not a regular file"
    assert call_tool(ctx, "Edit", file_path="pipe", old_string="a", new_string="b") == "Error: pipe is not a regular file"
    assert call_tool(ctx, "Grep", pattern="needle") == "a.txt"
    assert call_tool(ctx, "Grep", pattern="needle", output_mode="count") == "a.txt:1"


def test_a_runaway_regex_or_search_stops_at_the_time_limit(ctx, tmp_path, monkeypatch):
    monkeypatch.setattr(agent, "SEARCH_SECONDS", 1.0)
    monkeypatch.setattr(agent, "STOPPED", "[search stopped after 1 s; narrow the path, glob or pattern]")
    (tmp_path / "a.txt").write_text("a" * 60 + "b\n")
    started = time.monotonic()
    out = call_tool(ctx, "Grep", pattern="(a+)+$")
    assert time.monotonic() - started < 5
    assert out == "No matches found\n[search stopped after 1 s; narrow the path, glob or pattern]"


@pytest.mark.parametrize("tool, args", [
    ("Write", {"file_path": "keep.txt", "content": "new content"}),
    ("Edit", {"file_path": "keep.txt", "old_string": "original", "new_string": "changed"}),
])
def test_a_write_that_fails_midway_leaves_the_file_whole(ctx, tmp_path, monkeypatch, tool, args):
    (tmp_path / "keep.txt").write_text("original text\n")

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(agent.os, "fsync", disk_full)
    assert call_tool(ctx, tool, **args) == "Error: cannot write keep.txt: No space left on device"
    assert (tmp_path / "keep.txt").read_text() == "original text\n"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
