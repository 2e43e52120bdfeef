"""Attacks on the session's terminal (issue 33) that once succeeded, each kept as the test that shows it fixed."""

import os
from pathlib import Path

from app import main as agent
from tests.conftest import PROMPT
from tests.fake_openrouter import reply


def test_streamed_line_of_wide_characters_is_measured_by_its_end_only(monkeypatch):
    """A hostile model streams one 100,000-character line of wide characters (or combining marks): each piece
    redraws the unfinished line, and measuring all of it each time made the session crawl (quadratic)."""
    calls, real = [], agent.narrow
    monkeypatch.setattr(agent, "narrow", lambda text: calls.append(len(text)) or real(text))  # what is measured
    for piece in ("界" * 1000, "e\u0301" * 500):
        markdown, calls[:] = agent.Markdown(), []
        for _ in range(100):
            markdown.feed(piece, width=80, height=24)
            shown = markdown.unfinished()
        assert shown.startswith("…") and agent.rows_of(shown, 80) <= 22
        assert sum(calls) < 100 * 5000  # was about 100 * 50,000: every character measured at every piece


def test_history_file_is_never_written_through_a_symlink_nor_left_readable(serve, terminal, workspace, tmp_path):
    """A history file found as a symlink (to a file the user did not mean) is not written through; one found readable
    by others is made 0600 again before a prompt goes in it."""
    server = serve(lambda body: reply("ok"))
    term = terminal(server)
    term.ask("first", "ok")
    term.send("\x04")
    assert term.wait() == 0
    history = next((Path(os.environ["HOME"]) / ".solo" / "projects").glob("*/history"))
    target = tmp_path / "target"
    target.write_text("mine\n")
    history.unlink()
    history.symlink_to(target)
    term = terminal(server)
    term.ask("secret one", "ok")
    term.send("\x04")
    assert term.wait() == 0
    assert target.read_text() == "mine\n"
    history.unlink()
    history.write_text("first\n")
    history.chmod(0o644)
    term = terminal(server)
    term.ask("secret two", "ok")
    term.send("\x04")
    assert term.wait() == 0
    assert history.stat().st_mode & 0o777 == 0o600 and "secret two" in history.read_text()


def test_text_pasted_at_a_question_does_not_answer_it_by_its_first_letter(serve, terminal, workspace):
    """A careless user pastes "all good" while solo asks about a command: its "a" was "always", and the command ran
    (and would run again without asking); a paste is not an answer, the question is asked again."""
    from tests.test_keys import QUESTION, asks
    server = serve(asks("touch made"))
    term = terminal(server)
    term.send("go\r")
    term.expect(QUESTION)
    term.send("all good, go ahead")  # one paste: many keys at once
    term.expect("not an answer")
    term.expect("Please answer y")  # asked again
    assert not (workspace / "made").exists()
    term.send("n")
    term.expect("result of go: ")
    term.expect(PROMPT)
    assert not (workspace / "made").exists()
    term.send("\x04")
    assert term.wait() == 0


def first_history(server, terminal) -> Path:
    """The project's history file, made by a first session of one prompt."""
    term = terminal(server)
    term.ask("first", "answer to first")
    term.send("\x04")
    assert term.wait() == 0
    return next((Path(os.environ["HOME"]) / ".solo" / "projects").glob("*/history"))


def test_a_history_file_with_a_nul_byte_or_bad_lines_does_not_stop_the_session(serve, terminal, workspace):
    """A history file corrupted (or planted): a NUL byte, invalid JSON after the mark, a 2 MB entry, bytes that are
    not UTF-8. The session started with "internal error: ValueError: embedded null character"; now the bad entries
    are left out or taken as they are, and the arrows recall the good ones."""
    server = serve(lambda body: reply(f"answer to {body['messages'][-1]['content']}"))
    history = first_history(server, terminal)
    history.write_bytes(b"good one\n\x1e{bad json\n\x1e\"" + b"z" * 2_000_000 + b"\"\n\xff\xfe\x00binary\n"
                        b"\x1e\"nul\\u0000inside\"\nlast good\n")
    term = terminal(server)
    term.send("\x1b[A\r")  # the latest entry
    term.expect("answer to last good")
    term.expect(PROMPT)
    term.send("\x04")
    assert term.wait() == 0


def test_lines_pasted_during_a_turn_are_one_queued_prompt_not_one_a_line(serve, terminal, workspace):
    """Three lines pasted while a turn runs (the terminal sends each line's end as Enter) became three prompts, each
    a turn of its own; now a paste is one prompt, its lines kept."""
    import threading

    from tests.test_session import held, user_turns
    release = threading.Event()

    def model(body):
        if user_turns(body)[-1] == "go":
            return held("first ", "end", release)
        return reply("answer to " + user_turns(body)[-1].replace("\n", "|"))

    server = serve(model)
    term = terminal(server, term="xterm")
    term.send("go\r")
    term.expect("first")
    term.send("\x0b")  # Ctrl-K typed alone is no line break
    term.send("line one\rline two\rline three\r")  # one paste
    term.expect("queued: line one⏎line two⏎line three")  # queued, shown under the status line
    release.set()
    term.expect(r"answer to line one\|line two\|line three")
    term.expect(r"\x1b\[K> ")
    assert [user_turns(body)[-1] for body in server.bodies] == ["go", "line one\nline two\nline three"]
    term.send("\x04")
    assert term.wait() == 0


def test_after_ctrl_z_and_fg_at_a_question_the_question_is_shown_again(serve, workspace):
    """Ctrl-Z at a question, then fg: solo waited for a key under the shell's "fg" line with no question on the
    screen (a user would not know a key answers something); now the question and its legend are drawn again."""
    from tests.conftest import PROGRAM
    from tests.test_keys import QUESTION, asks
    from tests.test_prompt_line import Shell
    env = {**os.environ, "OPENROUTER_BASE_URL": serve(asks("touch made")).url, "OPENROUTER_API_KEY": "k",
           "TERM": "xterm"}
    sh = Shell(workspace, env)
    try:
        sh.send(f"{PROGRAM}\r")
        sh.expect(r"\n> ")
        sh.send("go\r")
        sh.expect(QUESTION)
        sh.expect("Esc no")
        sh.send("\x1a")
        sh.expect(r"Stopped.*\n(?:\x1b\[\?2004h)?\$ ")
        sh.send("fg\r")
        sh.expect(r"fg\r\n.*your_program\.sh.*\r\n")
        sh.expect(QUESTION + r"(?s:.*)y yes · n no")  # asked again, before any key
        sh.send("y")
        sh.expect("result of go")
        assert (workspace / "made").exists()
        sh.expect(r"\n> |\x1b\[K> ")
        sh.send("\x04")
        sh.expect(r"\$ ")
        sh.send("exit\r")
        assert sh.wait() == 0
    finally:
        if sh.proc.poll() is None:
            sh.proc.kill()
            sh.proc.wait()


def test_a_history_entry_with_c1_controls_is_not_drawn_raw_when_recalled(serve, terminal, workspace):
    """A planted history entry holding C1 controls (U+009B is CSI to a terminal that takes 8-bit controls) was drawn
    as it was by readline when recalled with the up arrow (C0 ones it shows as ^[); now they are left out."""
    server = serve(lambda body: reply(f"answer to {body['messages'][-1]['content']}"))
    history = first_history(server, terminal)
    history.write_text('\x1e"wiped\\u009b2J\\u009d0;title\\u009c now"\n', encoding="utf-8")
    term = terminal(server, term="xterm")
    term.send("\x1b[A")
    term.expect("now")
    term.send("\r")
    term.expect("answer to wiped2J0;title now")
    assert not any("\x80" <= ch <= "\x9f" for ch in term.transcript)
    term.expect(r"\x1b\[K> ")
    term.send("\x04")
    assert term.wait() == 0
