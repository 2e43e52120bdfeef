"""Answers drawn as Markdown (issue 33, faults 9 and 10): wrapped at words at the terminal's width with hanging
indents, tables measured on the screen and aligned, and the unfinished line shown plain while it streams."""

from __future__ import annotations

import io
import itertools
import random
import re
import threading
import unicodedata
from pathlib import Path

import pytest

from app import main as agent
from tests.conftest import screen_of
from tests.fake_openrouter import Stream, reply

SGR = re.compile(r"\x1b\[[0-9;]*m")


def drawn(text: str, width: int) -> list[str]:
    """An answer drawn whole at a width, as rows without their colours."""
    markdown = agent.Markdown()
    return SGR.sub("", markdown.feed(text, width=width) + markdown.feed("", end=True, width=width)).split("\n")[:-1]


PARAGRAPH = ("Solo wraps the text of an answer at word boundaries, at the width the terminal has when the line is "
             "drawn, so that no word is ever split between two rows of the screen unless it is longer than a row.")


@pytest.mark.parametrize("width", [40, 80])
def test_a_paragraph_wraps_at_words_within_the_width(width):
    rows = drawn(PARAGRAPH + "\n", width)
    assert all(agent.width_of(row) <= width for row in rows) and len(rows) > len(PARAGRAPH) // width
    assert " ".join(rows).split() == PARAGRAPH.split()  # every word whole, in order
    for row, after in itertools.pairwise(rows):  # greedy: the next row's first word did not fit on this one
        assert agent.width_of(row) + 1 + len(after.split()[0]) > width


def test_wrapping_at_40_columns_exactly():
    assert drawn(PARAGRAPH + "\n", 40) == [
        "Solo wraps the text of an answer at word",
        "boundaries, at the width the terminal",
        "has when the line is drawn, so that no",
        "word is ever split between two rows of",
        "the screen unless it is longer than a",
        "row."]


def test_a_line_that_fits_is_drawn_as_before():
    assert agent.Markdown().feed("Some **bold** and `code`.\n- item\n", width=80) == \
        "Some \x1b[1mbold\x1b[0m and \x1b[36mcode\x1b[0m.\n• item\n"


@pytest.mark.parametrize("line, first, hang", [
    ("- dash item", "• dash", "  "), ("* star item", "• star", "  "), ("+ plus item", "• plus", "  "),
    ("1. numbered item", "1. numbered", "   "), ("12) numbered item", "12) numbered", "    "),
    ("  - nested item", "  • nested", "    "), ("    * deeper item", "    • deeper", "      "),
    ("  continued paragraph", "  continued", "  ")])
def test_list_items_hang_their_rows_under_the_item_s_text(line, first, hang):
    rows = drawn(line + " " + "word " * 30 + "\n", 40)
    assert rows[0].startswith(first + " ") and len(rows) > 2
    assert all(row.startswith(hang) and row[len(hang)] != " " and agent.width_of(row) <= 40 for row in rows[1:])


def test_a_quote_keeps_its_bar_and_a_heading_its_style_on_every_row():
    rows = agent.Markdown().feed("> " + "quoted words " * 10 + "\n# " + "title words " * 10 + "\n",
                                 width=40).split("\n")[:-1]
    quote = [row for row in rows if "quoted" in row]
    heading = [row for row in rows if "title" in row]
    assert len(quote) == 4 and all(row.startswith("\x1b[90m│ \x1b[0m\x1b[3m") for row in quote)
    assert all(row.endswith("\x1b[0m") for row in quote + heading)  # no style runs on into what follows
    assert len(heading) == 4 and all(row.startswith("\x1b[1;4m") for row in heading)
    assert all(agent.width_of(row) <= 40 for row in rows)


def test_colours_take_no_width():
    rows = drawn("**" + " ".join(["bold"] * 20) + "**\n", 40)
    assert [len(row) for row in rows] == [39, 39, 19]


def test_a_word_longer_than_a_row_is_cut_at_the_width_and_a_url_is_kept_whole_when_it_fits():
    word = "x" * 100
    assert drawn(f"see {word} here\n", 40) == ["see", "x" * 40, "x" * 40, "x" * 20 + " here"]
    url = "https://example.com/" + "a" * 55
    rows = drawn(f"Read [the guide]({url}) first, it helps.\n", 80)
    assert rows == ["Read the guide", f"({url})", "first, it helps."]
    assert drawn(f"- a [link]({'https://x.org/' + 'b' * 60}) end\n", 40) == [
        "• a link", "  (https://x.org/" + "b" * 23, "  " + "b" * 37 + ")", "  end"]


def test_code_blocks_are_not_wrapped():
    code = "x = 1  # " + "a long comment " * 10
    rows = drawn(f"```python\n{code}\n```\n", 40)
    assert rows == ["╭─ python", "│ " + code, "╰─"]


def test_width_of_counts_columns_on_the_screen():
    assert [agent.width_of(t) for t in ("abc", "漢字", "e\u0301", "👍", "a\u200db", "\x1b[1mab\x1b[0m", "ｗ")] == \
        [3, 4, 1, 2, 2, 2, 2]
    assert [agent.rows_of(t, 4) for t in ("漢字", "漢字x", "e\u0301" * 4, "abc漢")] == [1, 2, 1, 2]


def columns_of(row: str) -> list[int]:
    """The screen columns where a drawn table row's separators are."""
    return [agent.width_of(row[:m.start()]) for m in re.finditer("[│┼]", row)]


def test_table_cells_are_measured_on_the_screen():
    table = ("| name | 名前 | mark |\n|---|---|---|\n| e\u0301te\u0301 | 漢字テスト | 👍 |\n"
             "| plain | ab | ✅✅ |\n| x | 日本 | - |\n")
    rows = drawn(table, 80)
    assert len(rows) == 5 and len({tuple(columns_of(row)) for row in rows}) == 1  # the bars line up on the screen
    assert rows[2] == "e\u0301te\u0301   │ 漢字テスト │ 👍"


def test_columns_honour_the_rule_row_s_alignment():
    rows = drawn("| left | centre | right |\n|:--|:--:|--:|\n| a | b | c |\n| long cell | 漢 | 22 |\n", 80)
    assert rows == ["left      │ centre │ right",
                    "──────────┼────────┼──────",
                    "a         │   b    │     c",
                    "long cell │   漢   │    22"]


def test_a_table_wider_than_the_screen_narrows_its_widest_columns_and_wraps_their_cells():
    long = "a rather long description of the thing that will not fit in forty columns at all"
    rows = drawn(f"| n | name | what |\n|--:|---|---|\n| 1 | solo | {long} |\n| 22 | other | short |\n", 40)
    assert all(agent.width_of(row) <= 40 for row in rows) and len({tuple(columns_of(row)) for row in rows}) == 1
    assert rows[0].startswith(" n │ name  │ ") and rows[2].startswith(" 1 │ solo  │ ")  # narrow columns kept whole
    cells = [row.split("│")[2].strip() for row in rows[2:-1]]
    assert " ".join(cells) == long and len(cells) > 2
    assert rows[-1].startswith("22 │ other │ short")


def test_a_table_on_a_very_narrow_screen_still_draws_every_cell():
    rows = drawn("| alpha | beta | gamma |\n|---|---|---|\n| one two | three | four five six |\n", 12)
    rule = next(i for i, row in enumerate(rows) if "┼" in row)
    assert all(agent.width_of(row) <= 12 for row in rows)
    for cells, words in ((rows[:rule], ["alpha", "beta", "gamma"]),
                         (rows[rule + 1:], ["onetwo", "three", "fourfivesix"])):
        assert ["".join(row.split("│")[k].strip() for row in cells) for k in range(3)] == words


class Screen(io.StringIO):
    """A terminal's stream, as far as Display can tell."""

    def isatty(self) -> bool:
        return True


def display(width: int = 80) -> tuple[agent.Display, Screen]:
    """A session's display on one fake terminal (stdout and stderr the same screen), `width` columns wide."""
    screen = Screen()
    shown = agent.Display(agent.Config(api_key="k", cwd=Path.cwd()), agent.Streams(None, screen, screen),
                          {"TERM": "xterm"})
    shown.width = width  # what measure() says where the stream has no terminal size
    return shown, screen


ANSWER = ("# Streaming\nThe words of a line show as they arrive and the line is drawn again once complete, "
          "wrapped at words.\n- a list item long enough to wrap onto a second row of the screen at forty columns\n"
          "```python\ndef f(x):  # a comment\n    return 'value'\n```\n| name | 名前 |\n|:--|--:|\n| a | 漢字 |\n"
          "| bbb | 2 |\n> a quote at the end that wraps as well when the screen is narrow\nlast line, unfinished")


@pytest.mark.parametrize("width", [40, 80])
@pytest.mark.parametrize("size", [1, 3, 7, 40, None])
def test_a_streamed_answer_ends_as_the_same_screen_as_one_drawn_whole(width, size):
    shown, screen = display(width)
    shown.working("thinking")
    pieces = [ANSWER[i: i + size] for i in range(0, len(ANSWER), size)] if size else \
        re.findall(r"\S+\s*|\s+", ANSWER)  # a word at a time
    for piece in pieces:
        shown.delta({"content": piece})
        shown.draw()  # the status line ticks between pieces
    shown({"type": "assistant", "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop",
           "usage": {}})
    shown.end_turn()
    whole = agent.Markdown().feed(ANSWER, end=True, width=width)
    assert screen_of(screen.getvalue(), width) == screen_of(whole, width)


def test_the_unfinished_line_shows_plain_as_it_comes_with_the_status_line_under_it():
    shown, screen = display(40)
    shown.working("thinking")
    shown.delta({"content": "# Title\nSome **bold** words that are still"})
    assert screen_of(screen.getvalue(), 40).split("\n")[-3:-1] == ["Title", "Some **bold** words that are still"]
    assert "thinking" in screen_of(screen.getvalue(), 40).split("\n")[-1]  # on the row under it, not over it
    for _ in range(3):
        shown.draw()  # ticks draw the status line again, never over the line
    shown.delta({"content": " coming in, more and more of them"})
    rows = screen_of(screen.getvalue(), 40).split("\n")
    assert rows[-3:-1] == ["Some **bold** words that are still comin", "g in, more and more of them"]
    assert "thinking" in rows[-1]
    shown.delta({"content": ".\n"})
    rows = screen_of(screen.getvalue(), 40).split("\n")
    assert rows[-3:-1] == ["Some bold words that are still coming", "in, more and more of them."]
    assert "**" not in screen_of(screen.getvalue(), 40) and "thinking" in rows[-1]


def test_a_line_shown_plain_as_it_is_drawn_stays_as_it_is():
    shown, screen = display(40)
    shown.working("thinking")
    for piece in ("Plain ", "words that fit.", "\nDone"):
        shown.delta({"content": piece})
    shown({"type": "assistant", "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop", "usage": {}})
    assert screen.getvalue().count("\x1b[1A\r\x1b[J") == 1  # "Plain " drawn anew as "Plain words that fit.", once
    assert screen.getvalue().count("Plain words that fit.") == 1 and screen.getvalue().count("Done") == 1
    assert screen_of(screen.getvalue(), 40).split("\n")[:2] == ["Plain words that fit.", "Done"]


def test_rows_of_an_unfinished_line_are_counted_at_the_width_when_it_is_drawn_over():
    shown, screen = display(80)
    shown.delta({"content": "word " * 12})  # 60 columns: one row at 80
    shown.width = 30  # the terminal was narrowed (and rewrapped the row into two)
    shown.delta({"content": "end\n"})
    assert screen.getvalue().endswith("\x1b[2A\r\x1b[J" + "word " * 5 + "word\n" + "word " * 5 + "word\nend\n")


def test_a_table_shows_its_lines_plain_until_it_ends_and_is_drawn_over_them():
    shown, screen = display(40)
    shown.delta({"content": "| a | b |\n|--:|---|\n| 1 | 漢字 |\n"})
    assert screen_of(screen.getvalue(), 40) == "| a | b |\n|--:|---|\n| 1 | 漢字 |\n"
    shown.delta({"content": "after"})
    shown.delta({"content": " it\n"})
    assert screen_of(screen.getvalue(), 40) == "a │ b\n──┼─────\n1 │ 漢字\nafter it\n"


def test_a_table_longer_than_the_screen_shows_the_lines_that_fit_then_is_drawn_whole():
    shown, screen = display(40)  # 24 rows: what shows plain stays on the screen, where it can be taken off
    table = "| n | square |\n|--:|--:|\n" + "".join(f"| {i} | {i * i} |\n" for i in range(40))
    shown.delta({"content": table + "after"})
    assert screen_of(screen.getvalue(), 40).split("\n")[:-1] == table.split("\n")[:21] + ["after"]
    shown.delta({"content": "\n"})
    rows = screen_of(screen.getvalue(), 40).split("\n")
    assert rows[:3] == [" n │ square", "───┼───────", " 0 │      0"] and rows[41:43] == ["39 │   1521", "after"]


def test_a_note_while_a_table_streams_goes_above_what_shows_plain_and_leaves_nothing_stale():
    shown, screen = display(40)
    shown.working("thinking")
    shown.delta({"content": "| a | b |\n|---|---|\n| 1 | 2"})
    shown.say("a hook said something")
    assert screen_of(screen.getvalue(), 40).split("\n")[:4] == ["solo: a hook said something", "| a | b |",
                                                                "|---|---|", "| 1 | 2"]
    shown.delta({"content": " |\nafter\n"})
    rows = screen_of(screen.getvalue(), 40).split("\n")
    assert rows[:5] == ["solo: a hook said something", "a │ b", "──┼──", "1 │ 2", "after"]
    assert rows[5][:1] in agent.SPINNER and len(rows) == 6


def test_a_long_unfinished_line_shows_only_its_end_where_it_would_not_fit_on_the_screen():
    shown, screen = display(20)
    text = " ".join(f"w{i}" for i in range(200))  # 889 columns: 45 rows of 20, the screen has 24
    shown.delta({"content": text})
    rows = screen_of(screen.getvalue(), 20).split("\n")
    assert rows[0].startswith("…") and text.endswith("".join(rows)[1:]) and len(rows) <= 23
    shown.delta({"content": "\n"})
    assert screen_of(screen.getvalue(), 20).split("\n")[:-1] == agent.wrap(text, 20)


def test_a_cancelled_turn_keeps_what_was_shown_drawn_and_a_retried_reply_starts_on_a_new_line():
    shown, screen = display(40)
    shown.delta({"content": "```sh\necho hi\nFirst **words"})
    shown({"type": "api_retry", "attempt": 1, "max_retries": 5, "retry_delay_ms": 500, "error_status": 502,
           "message": "HTTP 502", "error": "server_error"})
    shown.delta({"content": "Again"})
    shown.end_turn()
    rows = screen_of(screen.getvalue(), 40).split("\n")
    assert rows[:4] == ["╭─ sh", "│ echo hi", "│ First **words", "╰─"] and rows[4].startswith("solo: retrying in")
    assert screen_of(screen.getvalue(), 40).split("\n")[-2] == "Again"


def test_streamed_chunks_of_random_sizes_draw_the_same_answer():
    rng = random.Random(33)
    text = "\n".join(f"- item {i} " + "word " * rng.randint(0, 20) for i in range(40)) + "\n"
    shown, screen = display(40)
    at = 0
    while at < len(text):
        size = rng.randint(1, 30)
        shown.delta({"content": text[at: at + size]})
        at += size
    shown.end_turn()
    assert screen_of(screen.getvalue(), 40) == screen_of("\n".join(drawn(text, 40)) + "\n", 40)


# --- On a real terminal: tmux's screen while the model streams a word at a time ----------------------------------


def waiting(rows: list[str]) -> bool:
    """Whether the session is up and waiting: the prompt on the last row that shows anything."""
    return rows[-1] == ">"


def word_by_word(words: list[str], gates: list[threading.Event]) -> Stream:
    """A streamed reply that sends a word, then waits for the test's go before the next."""
    events: list = []
    for word, gate in zip(words, gates):
        events += [{"choices": [{"index": 0, "delta": {"content": word}}]}, lambda gate=gate: gate.wait(20)]
    return Stream(events + [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, "data: [DONE]\n\n"])


def test_words_show_as_they_stream_and_the_line_is_drawn_formatted_once_complete(serve, tmux):
    words = re.findall(r"\S+\s*", "Here **comes** a line that streams a word at a time and wraps at forty columns.\n"
                                  "- then a list item that is long enough to wrap under its own text\nDone.")
    gates = [threading.Event() for _ in words]
    server = serve(lambda body: word_by_word(words, gates))
    pane = tmux(server, width=40, height=24, ready=waiting)
    pane.send("stream it", "Enter")
    def shown(rows: list[str], so_far: str) -> bool:
        """The words so far on the rows after the prompt, plain, as they came (** and all, wrapped by the terminal
        anywhere), and the status line on the row under them (the input line under that), neither drawn over the
        other."""
        rows = rows[:-1] if rows[-1:] == ["›"] else rows  # the input line under the status line, nothing typed
        at = rows.index("> stream it") + 1 if "> stream it" in rows else len(rows)
        return "".join(rows[at:-1]).replace(" ", "") == so_far.replace(" ", "") and rows[-1][:1] in agent.SPINNER

    for i, gate in enumerate(gates[:8]):  # the first line, a word at a time: each shows before the line ends
        pane.wait(lambda rows, i=i: shown(rows, "".join(words[: i + 1])))
        gate.set()
    for gate in gates[8:]:
        gate.set()
    rows = pane.wait(lambda rows: rows[-1] == ">" and "Done." in rows)
    at = rows.index("> stream it") + 1
    assert rows[at:] == ["Here comes a line that streams a word at",
                         "a time and wraps at forty columns.",
                         "• then a list item that is long enough",
                         "  to wrap under its own text",
                         "Done.",
                         ">"]


def test_a_line_shown_plain_is_drawn_at_the_width_the_terminal_has_when_it_is_complete(serve, tmux):
    line = ("A sentence long enough to take three rows of a sixty column terminal while it streams plain, and it is "
            "drawn formatted once the terminal has been narrowed to fifty-four columns.")
    words = re.findall(r"\S+\s*", line + "\n| a | 名前 |\n|--|--:|\n| x | 1 |\nend\n")
    gates = [threading.Event() for _ in words]
    server = serve(lambda body: word_by_word(words, gates))
    pane = tmux(server, width=60, height=24, ready=waiting)
    pane.send("go", "Enter")
    last = len(re.findall(r"\S+\s*", line)) - 1
    for gate in gates[:last - 1]:
        gate.set()
    pane.wait(lambda rows: "".join(words[:last]).replace(" ", "") in "".join(rows).replace(" ", ""))
    pane.resize(54)  # the status line (under 50 columns) still fits on its row
    pane.wait(lambda rows: all(len(row) <= 54 for row in rows))
    for gate in gates[last - 1:]:
        gate.set()
    rows = pane.wait(lambda rows: rows[-1] == ">" and "end" in rows)
    assert rows[rows.index("> go") + 1:] == [*agent.wrap(line, 54), "a │ 名前", "──┼─────", "x │    1", "end", ">"]


def test_esc_in_the_middle_of_a_line_keeps_the_words_shown_drawn_and_nothing_stale(serve, tmux):
    words = ["Here ", "**comes** ", "a ", "line ", "never ", "finished"]
    gates = [threading.Event() for _ in words]
    server = serve(lambda body: word_by_word(words, gates))
    pane = tmux(server, width=40, height=24, ready=waiting)
    pane.send("stream it", "Enter")
    for gate in gates[:3]:
        gate.set()
    pane.wait(lambda rows: "Here **comes** a line" in rows)
    pane.send("Escape")
    rows = pane.wait(lambda rows: rows[-1] == ">" and "solo: cancelled" in rows)
    assert rows[rows.index("> stream it") + 1:] == ["Here comes a line", "solo: cancelled", ">"]
    for gate in gates:
        gate.set()


def test_a_table_of_wide_characters_emoji_and_combining_marks_on_a_real_terminal(serve, tmux):
    answer = ("| name | 名前 | mark |\n|:--|:--:|--:|\n| e\u0301te\u0301 | 漢字テスト | 👍 |\n| plain | ab | ✅✅ |\n"
              "| x | 日本 | - |\nend")
    server = serve(lambda body: reply(answer))
    pane = tmux(server, width=80, height=24, ready=waiting)
    pane.send("a table", "Enter")
    rows = pane.wait(lambda rows: rows[-1] == ">" and "end" in rows)
    assert [unicodedata.normalize("NFC", row) for row in rows[rows.index("> a table") + 1:]] == [
        "name  │    名前    │ mark", "──────┼────────────┼─────", "été   │ 漢字テスト │   👍",
        "plain │     ab     │ ✅✅", "x     │    日本    │    -", "end", ">"]
