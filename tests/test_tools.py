"""Each tool for real in tmp_path: real files, a real shell, real (short) timeouts."""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import re
import signal
import stat
import threading
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


@pytest.mark.parametrize("bom, codec", [(codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be")])
def test_read_decodes_utf16_with_a_bom_and_says_so(ctx, tmp_path, bom, codec):
    (tmp_path / "u.txt").write_bytes(bom + "héllo\nwörld ✓\n".encode(codec))
    out = call_tool(ctx, "Read", file_path="u.txt")
    assert out == f"héllo\nwörld ✓\n\n[u.txt is {codec} text with a byte-order mark, shown decoded; " \
        "Edit and Write keep that encoding]"


def test_read_says_it_showed_latin1_text(ctx, tmp_path):
    (tmp_path / "l.txt").write_bytes(b"caf\xe9 cr\xe8me\n")
    out = call_tool(ctx, "Read", file_path="l.txt")
    assert out.startswith("café crème\n") and "[l.txt is latin-1 text, shown decoded;" in out


@pytest.mark.parametrize("make_links", [
    lambda p: ((p / "a").symlink_to("b"), (p / "b").symlink_to("a")),  # a loop
    lambda p: (p / "a").symlink_to("b"),  # points nowhere
])
def test_read_a_broken_symlink_says_so_not_file_not_found(ctx, tmp_path, make_links):
    make_links(tmp_path)
    assert call_tool(ctx, "Read", file_path="a") == \
        "Error: a is a symbolic link that loops or points nowhere (b)"


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


def test_write_over_latin1_keeps_latin1_and_refuses_what_it_cannot_hold(ctx, tmp_path):
    target = tmp_path / "l.txt"
    target.write_bytes(b"caf\xe9\n")
    assert call_tool(ctx, "Write", file_path="l.txt", content="café crème\n").startswith("Updated l.txt")
    assert target.read_bytes() == b"caf\xe9 cr\xe8me\n"
    assert call_tool(ctx, "Write", file_path="l.txt", content="5 €\n") == \
        "Error: l.txt is latin-1 text and the new text has characters it cannot hold ('€'); the file was left as is"
    assert target.read_bytes() == b"caf\xe9 cr\xe8me\n"


WRITES = [
    ("Write", {"file_path": "keep.txt", "content": "new text\n"}),
    ("Edit", {"file_path": "keep.txt", "old_string": "old", "new_string": "new"}),
]


@pytest.mark.parametrize("tool, args", WRITES)
def test_writes_keep_hard_links(ctx, tmp_path, tool, args):
    (tmp_path / "keep.txt").write_text("old text\n")
    os.link(tmp_path / "keep.txt", tmp_path / "other.txt")
    assert not call_tool(ctx, tool, **args).startswith("Error")
    assert (tmp_path / "other.txt").read_text() == "new text\n"
    assert (tmp_path / "keep.txt").stat().st_ino == (tmp_path / "other.txt").stat().st_ino


@pytest.mark.parametrize("tool, args", WRITES)
def test_writes_in_place_when_the_rename_is_refused(ctx, tmp_path, monkeypatch, tool, args):
    (tmp_path / "keep.txt").write_text("old text\n")

    def busy(src, dst):  # as for a bind-mounted file
        raise OSError(errno.EBUSY, "Device or resource busy", str(dst))

    monkeypatch.setattr(agent.os, "replace", busy)
    assert not call_tool(ctx, tool, **args).startswith("Error")
    assert (tmp_path / "keep.txt").read_text() == "new text\n"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("tool, args", WRITES)
def test_writes_keep_another_users_ownership(ctx, tmp_path, tool, args):
    (tmp_path / "keep.txt").write_text("old text\n")
    os.chown(tmp_path / "keep.txt", 12345, 12345)
    assert not call_tool(ctx, tool, **args).startswith("Error")
    assert (tmp_path / "keep.txt").read_text() == "new text\n"
    st = (tmp_path / "keep.txt").stat()
    assert (st.st_uid, st.st_gid) == (12345, 12345)


@pytest.mark.parametrize("tool, args", [(tool, {**args, "file_path": "link.txt"}) for tool, args in WRITES])
def test_a_write_error_names_the_path_the_model_gave(ctx, tmp_path, monkeypatch, tool, args):
    (tmp_path / "keep.txt").write_text("old text\n")
    (tmp_path / "link.txt").symlink_to("keep.txt")

    def read_only(src, dst):
        raise OSError(errno.EROFS, "Read-only file system", str(dst))

    monkeypatch.setattr(agent.os, "replace", read_only)
    assert call_tool(ctx, tool, **args) == "Error: cannot write link.txt: Read-only file system"
    assert (tmp_path / "keep.txt").read_text() == "old text\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt", "link.txt"]


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


def test_edit_gives_added_lines_the_crlf_ending(ctx, tmp_path):
    (tmp_path / "w.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    call_tool(ctx, "Edit", file_path="w.txt", old_string="two", new_string="two\nand a half\nnearly")
    assert (tmp_path / "w.txt").read_bytes() == b"one\r\ntwo\r\nand a half\r\nnearly\r\nthree\r\n"


@pytest.mark.parametrize("bom, codec", [(codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be")])
def test_edit_keeps_utf16_and_its_bom(ctx, tmp_path, bom, codec):
    (tmp_path / "u.txt").write_bytes(bom + "a = 'é'\nb = 2\n".encode(codec))
    assert call_tool(ctx, "Edit", file_path="u.txt", old_string="b = 2", new_string="b = '✓'") == \
        "Edited u.txt: replaced 1 occurrence"
    assert (tmp_path / "u.txt").read_bytes() == bom + "a = 'é'\nb = '✓'\n".encode(codec)


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


@pytest.fixture
def stop_signals_raise():
    """Stop signals unwind as in cli(): Ctrl-C as KeyboardInterrupt, SIGTERM and SIGHUP as Terminated."""
    def terminated(signum, frame):
        raise agent.Terminated(signum)
    handlers = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: terminated, signal.SIGHUP: terminated}
    saved = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("sig, raised", [
    (signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, agent.Terminated), (signal.SIGHUP, agent.Terminated),
])
def test_bash_a_stop_signal_while_the_command_starts_still_kills_it(ctx, monkeypatch, stop_signals_raise,
                                                                      sig, raised):
    started, real_popen = [], agent.subprocess.Popen

    def popen_then_signal(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        os.kill(os.getpid(), sig)  # lands before Popen has returned to tool_bash
        return started[-1]

    monkeypatch.setattr(agent.subprocess, "Popen", popen_then_signal)
    try:
        with pytest.raises(raised):
            call_tool(ctx, "Bash", command="sleep 60")
        with pytest.raises(ProcessLookupError):
            os.killpg(started[0].pid, 0)
    finally:
        for proc in started:
            agent.signal_group(proc.pid, signal.SIGKILL)
            proc.wait()


def pipe_fds() -> int:
    """How many pipe ends this process holds."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd is gone by now
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    return count


def within(seconds: float, check) -> bool:
    """Whether check() comes true before the deadline (polled)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_bash_pipes_held_by_background_processes_are_bounded(tmp_path):
    ctx = agent.ToolContext(cwd=tmp_path, env=agent.command_env(dict(os.environ)), leftovers=agent.Leftovers(cap=2))
    pipes, threads, groups = pipe_fds(), threading.active_count(), []
    try:
        for _ in range(5):
            out = call_tool(ctx, "Bash", command="sleep 30 &")
            groups += [int(n) for n in re.findall(r"process group (\d+)", out)]
        assert len(groups) == 5
        assert within(5, lambda: pipe_fds() <= pipes + 2), (pipe_fds(), pipes)
        assert threading.active_count() <= threads + 1
    finally:
        for group in groups:
            agent.signal_group(group, signal.SIGKILL)
    assert within(5, lambda: pipe_fds() <= pipes)  # the drain thread closes the rest once the writers are gone


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


def test_glob_expands_braces(ctx, tmp_path):
    for name in ["a.ts", "sub/b.js", "c.py"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    assert set(call_tool(ctx, "Glob", pattern="**/*.{ts,js}").splitlines()) == {"a.ts", "sub/b.js"}


@pytest.mark.parametrize("pattern, path, matches", [
    ("**/*.py", "a.py", True),  # '**/' is zero folders ...
    ("**/*.py", "x/y/a.py", True),  # ... or more
    ("src/**/*.ts", "src/a.ts", True),
    ("src/**/*.ts", "src/x/y/b.ts", True),
    ("src/**/*.ts", "lib/src/a.ts", False),
    ("*.py", "x/a.py", False),  # '*' stays within a name
    ("a*", "ab/c", False),
    ("?.py", "a.py", True),
    ("a?c", "a/c", False),  # so does '?'
    ("[!a]*.py", "b.py", True),
    ("[!a]*.py", "a.py", False),
    ("[a-c].txt", "b.txt", True),
    ("*.{ts,{js,jsx}}", "x.jsx", True),  # nested braces
    ("*.{ts,{js,jsx}}", "x.j", False),
    ("{a,b", "{a,b", True),  # an unclosed '{' is literal
    ("{a,b", "a", False),
    ("a+(b).txt", "a+(b).txt", True),  # regex characters are literal
    ("x[!a]y", "x/y", False),  # a class never matches '/'
    ("[!]]b", "ab", True),  # a ']' first in a class is literal
    ("[!]]b", "]b", False),
])
def test_glob_regex(pattern, path, matches):
    assert (re.fullmatch(agent.glob_regex(pattern), path) is not None) is matches


def make_dated_files(folder, count: int) -> None:
    """Files f0000.txt, f0001.txt, ... each containing 'x', each newer than the one before."""
    for i in range(count):
        path = folder / f"f{i:04}.txt"
        path.write_text("x")
        os.utime(path, (1_000_000 + i, 1_000_000 + i))


@pytest.mark.parametrize("tool, args", [("Glob", {"pattern": "*.txt"}), ("Grep", {"pattern": "x"})])
def test_newest_first_is_over_all_matches_with_the_true_total(ctx, tmp_path, tool, args):
    make_dated_files(tmp_path, 2100)
    lines = call_tool(ctx, tool, **args).splitlines()
    assert lines[:100] == [f"f{i:04}.txt" for i in range(2099, 1999, -1)]
    assert lines[100:] == ["[2000 more files not shown (2100 in all); narrow the search]"]


def test_glob_says_a_folder_could_not_be_read(ctx, tmp_path, monkeypatch):
    for name in ["a.py", "locked/b.py"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path) == str(tmp_path / "locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    out = call_tool(ctx, "Glob", pattern="**/*.py")
    assert out.splitlines()[0] == "a.py" and "could not be read" in out and "locked" in out


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


def test_grep_glob_with_double_star_matches_zero_folders(ctx, tmp_path):
    for name in ["src/a.ts", "src/x/b.ts", "src/c.js", "a.ts"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("needle")
    out = call_tool(ctx, "Grep", pattern="needle", glob="src/**/*.ts")
    assert set(out.splitlines()) == {"src/a.ts", "src/x/b.ts"}


@pytest.mark.parametrize("length, at", [
    (3_000, 2_500),
    (3_000_000, 2_999_990),  # near the end of a line of several pieces
    (3_000_000, "seam"),  # across the seam of two pieces
])
def test_grep_searches_whole_lines(ctx, tmp_path, length, at):
    at = agent.GREP_PIECE - 3 if at == "seam" else at
    line = "a" * at + "NEEDLE" + "b" * (length - at - 6)
    (tmp_path / "long.txt").write_text("short\n" + line + "\nlast\n")
    assert call_tool(ctx, "Grep", pattern="NEEDLE") == "long.txt"
    out = call_tool(ctx, "Grep", pattern="NEEDLE", output_mode="content")
    assert out.startswith("long.txt:2:...") and "NEEDLE" in out and len(out) < agent.GREP_LINE_LIMIT + 50


def test_grep_says_a_file_could_not_be_read_and_lists_the_others(ctx, tree, monkeypatch):
    real_open_text = agent.open_text

    def open_text(path):
        if path.name == "a.py":
            raise PermissionError(13, "Permission denied", str(path))
        return real_open_text(path)

    monkeypatch.setattr(agent, "open_text", open_text)
    lines = call_tool(ctx, "Grep", pattern="main").splitlines()
    assert lines[0] == "sub/c.py"
    assert lines[1].startswith("[1 files or folders could not be read") and "a.py: Permission denied" in lines[1]


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
