"""Attacks on the session's terminal (issue 33) that once succeeded, each kept as the test that shows it fixed."""

from app import main as agent


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
