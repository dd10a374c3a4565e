"""The agent's output as a person watches it (runs/liveoutput.py): whole lines only (a secret is
masked whole), hidden characters escaped, a flood cut to the rate with what was dropped said,
lines that wait for no more output sent after the interval, the rest at the end."""

from __future__ import annotations

import threading
import time

from airlockd.runs import liveoutput
from airlockd.runs.liveoutput import LiveOutput


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def collect(clock: Clock | None = None) -> tuple[LiveOutput, list[tuple[str, int]]]:
    sent: list[tuple[str, int]] = []
    live = LiveOutput(lambda text, dropped: sent.append((text, dropped)), **({"clock": clock} if clock else {}))
    return live, sent


def test_only_whole_lines_go_and_a_value_split_across_chunks_arrives_whole() -> None:
    clock = Clock()
    live, sent = collect(clock)
    live.feed(b"token=sk-abc")  # the rest of the line is still to come
    clock.now += 1
    live.feed(b"def\nnext")
    assert sent == [("token=sk-abcdef\n", 0)]
    live.close()
    assert sent[-1] == ("next\n", 0)


def test_hidden_characters_are_escaped_and_a_carriage_return_cannot_overwrite_a_line() -> None:
    live, sent = collect()
    live.feed(b"\x1b]0;pwned\x07ok\r\nfake\rreal\n\xe2\x80\xaeevil\n\xff\n")
    live.close()
    text = "".join(t for t, _ in sent)
    assert text == "\\x1b]0;pwned\\x07ok\nfake\\rreal\n\\u202eevil\n\ufffd\n"
    assert "\x1b" not in text and "\r" not in text


def test_a_line_longer_than_the_bound_shows_its_start_and_counts_the_rest() -> None:
    live, sent = collect()
    live.feed(b"x" * (liveoutput.LINE_BYTES * 2 + 10))
    live.feed(b"\nnext\n")
    live.close()
    lines = "".join(t for t, _ in sent).splitlines()
    assert lines == ["x" * liveoutput.SHOWN + " [… the rest of this long line is not shown]", "next"]
    assert sum(d for _, d in sent) == liveoutput.LINE_BYTES + 10 + 1


def test_each_line_is_redacted_whole_before_its_escapes() -> None:
    secret = "sk-proj-Zq8Kx2LmN4pR7tV9wY3bC6dF1gH5jA0s"
    sent: list[tuple[str, int]] = []
    live = LiveOutput(lambda t, d: sent.append((t, d)), redact=lambda t: t.replace(secret, "[REDACTED]"))
    live.feed(f"key={secret[:10]}".encode())  # split across two chunks
    live.feed(f"{secret[10:]} and\x1b[2J\n".encode())
    # a secret around where a long line is cut: the window is redacted before the cut
    live.feed(b"y" * (liveoutput.SHOWN - 5) + secret.encode() + b"z" * 2000 + b"\n")
    live.close()
    text = "".join(t for t, _ in sent)
    assert "key=[REDACTED] and\\x1b[2J\n" in text
    assert secret[:5] not in text and "sk-pr" not in text


def test_a_flood_is_cut_to_the_rate_and_what_was_dropped_is_said() -> None:
    clock = Clock()
    live, sent = collect(clock)
    line = b"y" * 1023 + b"\n"
    for _ in range(1024):  # 1 MiB at once: the burst passes, the rest is dropped
        live.feed(line)
    clock.now += 1.0  # a second later: the rate's worth passes again
    for _ in range(128):
        live.feed(line)
    live.close()
    shown = sum(len(t) for t, _ in sent)
    dropped = sum(d for _, d in sent)
    assert shown == liveoutput.BURST + liveoutput.RATE
    assert shown + dropped == 1152 * 1024 and dropped > 0


def test_lines_waiting_for_no_more_output_are_sent_after_the_interval() -> None:
    got = threading.Event()
    sent: list[str] = []
    live = LiveOutput(lambda text, dropped: (sent.append(text), got.set()))
    live.feed(b"first\n")  # sent at once: nothing went before
    got.clear()
    live.feed(b"second\n")  # within the interval: waits, then goes by the timer
    assert got.wait(5) and sent == ["first\n", "second\n"]
    t0 = time.monotonic()
    live.close()
    assert time.monotonic() - t0 < 1 and sent == ["first\n", "second\n"]


def test_one_chunk_of_many_lines_goes_in_batches_of_bounded_size() -> None:
    """A single chunk may hold the whole burst (`yes` fills 64 KiB reads): it goes as several
    batches, none much past BATCH_BYTES, so no event line of the run's process grows with it."""
    clock = Clock()
    live, sent = collect(clock)
    live.feed(b"y\n" * (128 * 1024))  # 256 KiB in one read
    live.close()
    assert len(sent) > 8
    assert max(len(t) for t, _ in sent) <= liveoutput.BATCH_BYTES + liveoutput.LINE_BYTES
    assert sum(len(t) for t, _ in sent) == liveoutput.BURST


def test_the_daemon_reads_a_run_process_lines_of_any_length() -> None:
    """asyncio's line reader gives up at 64 KiB and would end the reading of a run's events; the
    daemon's own drops an over-long line whole and goes on."""
    import asyncio

    from airlockd.lsp.runs import bounded_lines

    async def lines(data: bytes, limit: int) -> list[bytes]:
        stream = asyncio.StreamReader()
        stream.feed_data(data)
        stream.feed_eof()
        return [line async for line in bounded_lines(stream, limit, "r1")]

    data = b"first\n" + b"x" * 300_000 + b"\nafter\n" + b"y" * 70_000 + b"\nlast"
    assert asyncio.run(lines(data, 100_000)) == [b"first", b"after", b"y" * 70_000, b"last"]
    assert asyncio.run(lines(b"a\n\nb\n", 10)) == [b"a", b"", b"b"]
