"""tests/bench.py's own measuring, on the figure that once crashed it (the README tells users to run the bench)."""

from __future__ import annotations

import statistics

import pytest

from tests import bench


@pytest.mark.parametrize("break_after, lines", [(None, 30), (20, 20 + 30)],
                         ids=["whole stream", "stream broken once and retried"])
def test_chunk_delays_time_each_text_chunk_by_the_chunk_that_carried_it(tmp_path, break_after, lines):
    """Only text deltas are counted (message_start, content_block_start and the rest are not chunks), and a
    stream retried after a break sends its chunks again: each line is timed from its own chunk's last sending."""
    delays = bench.chunk_delays(tmp_path, chunks=30, break_after=break_after)
    assert len(delays) == lines  # the retry's 30 text lines follow the broken stream's 20
    assert statistics.median(delays) < 0.1  # seconds
    late = [d for d in delays if d > 0.45]  # timed from the broken stream's sending, 20 would wait out the backoff
    assert len(late) < 5, late  # (at least 0.5 s); a loaded machine may delay a few


def test_text_delta_is_the_text_of_a_text_delta_alone():
    text = b'{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta",' \
           b'"text":"7 "}}}'
    start = b'{"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"text",' \
            b'"text":""}}}'
    assert [bench.text_delta(text), bench.text_delta(start), bench.text_delta(b'{"type":"result"}')] == ["7 ", None, None]
