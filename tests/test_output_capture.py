"""The pure side of what a job printed (cronkeeper.output): the cap keeps exactly the first and
the last half, however the bytes arrive; what a terminal, a page and last_error are shown;
the ``output_limit`` key and its digest."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronkeeper.output import (
    Capture,
    for_terminal,
    last_lines,
    left_out_line,
    tail_text,
    with_tail,
)
from cronkeeper.schedule.model import Misfire, ScheduleSpec, canonical_json
from cronkeeper.schedule.values import size


def reference(data: bytes, limit: int) -> bytes:
    """What the cap must keep, written the obvious way."""
    if len(data) <= limit:
        return data
    head, tail = data[: limit // 2], data[len(data) - (limit - limit // 2):]
    line = b"[cronkeeper: %d bytes left out]\n" % (len(data) - len(head) - len(tail))
    return head + (b"\n" if head and not head.endswith(b"\n") else b"") + line + tail


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=3000), limit=st.integers(1, 1200),
       cuts=st.lists(st.integers(0, 3000), max_size=40))
def test_capture_keeps_exactly_the_first_and_last_half_however_the_bytes_arrive(data, limit, cuts):
    capture = Capture(limit)
    start = 0
    for cut in sorted(cuts) + [len(data)]:
        capture.feed(data[start:cut])
        start = max(start, cut)
    assert capture.total == len(data)
    assert capture.close() == reference(data, limit)


def test_a_capture_of_64_kib_of_a_megabyte():
    data = bytes(range(256)) * 4096
    capture = Capture(64 * 1024)
    for i in range(0, len(data), 4000):
        capture.feed(data[i:i + 4000])
    kept = capture.close()
    assert kept[:32768] == data[:32768] and kept[-32768:] == data[-32768:]
    assert kept[32768:-32768] == b"\n" + left_out_line(len(data) - 65536)
    assert left_out_line(983040) == b"[cronkeeper: 983040 bytes left out]\n"


def test_a_closed_capture_ignores_later_lines_and_threads_do_not_lose_any():
    capture = Capture(1 << 20)

    def write(tag: bytes) -> None:
        for i in range(2000):
            capture.feed(tag + b"%d\n" % i)

    threads = [threading.Thread(target=write, args=(t,)) for t in (b"a", b"b", b"c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kept = capture.close()
    capture.feed(b"after the end\n")
    assert capture.close() == kept and b"after" not in kept
    lines = kept.split(b"\n")[:-1]
    assert sorted(lines) == sorted(t + b"%d" % i for t in (b"a", b"b", b"c") for i in range(2000))
    for tag in (b"a", b"b", b"c"):  # each writer's lines in its own order
        assert [x for x in lines if x.startswith(tag)] == [tag + b"%d" % i for i in range(2000)]


def test_a_terminal_sees_control_characters_and_bad_utf8_escaped():
    raw = b"\x1b[2J\x1b]0;title\x07ok\tthen\r\nnext\x9b\xff\xc3\xa9 \xe2\x80\xae evil\n"
    shown = for_terminal(raw)
    assert shown == "\\x1b[2J\\x1b]0;title\\x07ok\tthen\\x0d\nnext\\x9b\\xffé \\u202e evil\n"
    assert not any(ord(ch) < 0x20 and ch not in "\n\t" for ch in shown)


def test_last_lines_and_the_tail_that_last_error_keeps():
    data = b"".join(b"line %d\n" % i for i in range(1, 31))
    assert last_lines(data) == [f"line {i}" for i in range(21, 31)]
    assert last_lines(b"no newline at the end") == ["no newline at the end"]
    assert last_lines(b"\x1b[31mred\n") == ["\\x1b[31mred"]
    assert last_lines(b"") == []
    assert tail_text(data) == "\n".join(f"line {i}" for i in range(21, 31))
    assert tail_text(b"x" * 5000 + b"\n", most=100) == "x" * 100
    assert tail_text(b"\xff bad\n") == "\ufffd bad"
    assert tail_text(None) == "" and with_tail("exit status 1", b"") == "exit status 1"
    assert with_tail("exit status 1", b"a\nb\n") == "exit status 1\noutput (last lines):\na\nb"


@pytest.mark.parametrize(("text", "result"), [
    ("64KiB", 65536), ("1MiB", 1048576), ("500B", 500), ("0B", 0), (" 2 KiB ", 2048),
    ("2MiB", "'output_limit' must be at most 1MiB, got \"2MiB\""),
    ("64KB", "'output_limit': unknown unit in \"64KB\"; did you mean \"64KiB\"? (units are B, "
             "KiB and MiB)"),
    ("65536", "'output_limit': \"65536\" needs a unit: \"65536B\" (or KiB, MiB)"),
    ("lots", "'output_limit': \"lots\" is not a size string like \"64KiB\", \"1MiB\" or \"500B\""),
    (65536, "'output_limit' must be a size string like \"64KiB\", \"1MiB\" or \"500B\", not an "
            "integer (write \"65536B\")"),
])
def test_sizes(text, result):
    assert size("output_limit", text, high=1 << 20) == result


def test_output_limit_is_in_the_digest_only_when_set():
    plain = ScheduleSpec("s", "UTC", Misfire.SKIP, every=60.0, task="t")
    limited = ScheduleSpec("s", "UTC", Misfire.SKIP, every=60.0, task="t", output_limit=1024)
    # A schedule that does not set it keeps the digest it had before the key existed (this one,
    # as the release before computed it), so no schedule becomes a new version by the upgrade.
    assert "output_limit" not in plain.to_json()
    assert plain.digest == "ef17508db5f8ca341fb43d843d5a447b504487a0af3a3b02102b267098ac03f8"
    assert limited.to_json()["output_limit"] == 1024 and limited.digest != plain.digest
    for spec in (plain, limited):
        assert spec.canonical_text() == canonical_json(spec.to_json())
        assert ScheduleSpec.from_json(json.loads(spec.canonical_text())) == spec
    assert limited.renamed("u", "t2", None, "f", 1).output_limit == 1024
