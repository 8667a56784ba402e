"""The fast reader agrees with tomllib wherever it answers, and the line scanner finds lines."""

from __future__ import annotations

import tomllib

from hypothesis import given, settings
from hypothesis import strategies as st

from cronkeeper.schedule import fasttoml
from cronkeeper.schedule.lines import LineIndex

bare = st.from_regex(r"[A-Za-z0-9_-]{1,8}", fullmatch=True)
plain = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters='"\\\x7f'), max_size=12)
basic = plain.filter(lambda s: all(c == "\t" or ord(c) >= 0x20 for c in s)).map(lambda s: f'"{s}"')
literal = plain.filter(lambda s: "'" not in s and all(c == "\t" or ord(c) >= 0x20 for c in s)).map(
    lambda s: f"'{s}'"
)
key = st.one_of(bare, basic, literal)
scalar = st.one_of(
    basic,
    literal,
    st.integers(-(10**17), 10**17).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda f: f"{f:.6e}"),
    st.sampled_from(["true", "false", "0", "-0", "1.5", "3e2", "007", "1_000", "inf", "nan"]),
)
array = st.lists(scalar, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]")
inline = st.lists(st.tuples(key, st.one_of(scalar, array)), max_size=4).map(
    lambda kvs: "{ " + ", ".join(f"{k} = {v}" for k, v in kvs) + " }"
)
value = st.one_of(scalar, array, inline)
line = st.one_of(
    st.tuples(key, value).map(lambda kv: f"{kv[0]} = {kv[1]}"),
    key.map(lambda k: f"[{k}]"),
    key.map(lambda k: f"  [{k}] # indented: read line by line"),
    st.sampled_from(["", "# comment", "  ", "[a.b]", "a.b = 1", 'x = """\nmulti\n"""', "[[t]]"]),
)
document = st.lists(line, max_size=12).map("\n".join)


@settings(max_examples=400, deadline=None)
@given(document)
def test_fast_reader_agrees_with_tomllib(text):
    fast = fasttoml.parse(text)
    try:
        expected = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        assert fast is None  # an invalid file is always left to tomllib, which reports it
        return
    if fast is not None:
        doc, lines = fast
        assert doc == expected
        index = LineIndex(text)  # the scanner for files outside the subset: same lines
        for name, table in doc.items():
            assert lines.line(name) == index.line(name)
            for k in table if isinstance(table, dict) else ():
                assert lines.line(name, k, "x") == index.line(name, k, "x"), (name, k)


def test_fast_reader_records_lines_and_leaves_the_rest_to_tomllib():
    text = '# c\n[job]\ncron = "x"\n\nbackoff = { base = "1s" }\n[next]\nx = 1\n'
    doc, lines = fasttoml.parse(text)
    assert doc == {"job": {"cron": "x", "backoff": {"base": "1s"}}, "next": {"x": 1}}
    full = LineIndex(text)  # the scanner used for files outside the subset agrees
    for path, line in [(("job",), 2), (("job", "cron"), 3), (("job", "backoff"), 5),
                       (("job", "backoff", "base"), 5), (("job", "x"), 2), (("next", "x"), 7),
                       (("nowhere",), 1)]:  # fmt: skip
        assert lines.line(*path) == full.line(*path) == line, path
    for outside in ['[a]\nx = """\nm\n"""\n', "[a.b]\n", "[a]\nx = 2026-01-01\n", '[a]\nx = "\\n"\n',
                    "[a]\nx = 1\nx = 2\n", "[a]\n[a]\n", "[a]\nx = [\n1]\n"]:  # fmt: skip
        assert fasttoml.parse(outside) is None, outside


def test_line_scanner_skips_multiline_values():
    text = (
        '[a]\n'
        'description = """\n'
        '[not-a-header]\n'
        'cron = "no"\n'
        '"""\n'
        'matrix = [\n'
        '  [1, 2],\n'
        '  [3]\n'
        ']\n'
        'cron = "0 4 * * *"\n'
        '["quoted.name"]\n'
        'backoff.base = "1s"\n'
        '[a.payload]\n'
        'x = 1\n'
    )
    index = LineIndex(text)
    assert index.line("a") == 1
    assert index.line("a", "cron") == 10
    assert index.line("a", "matrix", "0") == 6
    assert index.line("quoted.name") == 11
    assert index.line("quoted.name", "backoff", "base") == 12
    assert index.line("a", "payload", "x") == 14
    assert index.line("not-a-header") == 1  # unknown: the first line
