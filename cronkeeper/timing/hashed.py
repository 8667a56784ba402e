"""``H``: a value of a cron field fixed per schedule by a hash of its name (docs/schedules.md).

Jenkins' spreading, in any field of a 5- or 6-field expression, as a whole list item:

- ``H``: one value in the field's range; in day-of-month 1-28 (every month has those days, so
  the schedule fires every month) and in day-of-week 0-6 (Sunday counted once, not as 0 and 7);
- ``H(a-b)``: one value in ``a``-``b`` (names allowed where the field has them: ``H(mon-fri)``);
- ``H/n`` and ``H(a-b)/n``: a start within the first step (``a + hash mod n``), then every ``n``
  up to the range's end, so ``H/15`` in minutes is four minutes of the hour, 15 apart (``H/1``
  is every value: its start can only be the first). A step larger than the range is an error
  (no start would be sure to fall inside it).

The hash, stable across releases (a test pins known values): the first 8 bytes, big-endian, of
SHA-256 of the UTF-8 text ``NAME + " " + FIELD`` (``FIELD``: ``second``, ``minute``, ``hour``,
``day-of-month``, ``month`` or ``day-of-week``), an unsigned integer ``h``; the value is
``low + h mod size`` (``size``: the number of values in the range, or the step for ``/n``).
Every ``H`` item of one field uses the field's one ``h``: ``H(0-29),H(30-59)`` is two minutes
half an hour apart.

:func:`resolve` rewrites an expression into the plain grammar for one name (``H 6 * * *`` for
``nightly`` -> ``37 6 * * *``): everything after it (triggers and their shared tables, DST rules
and warnings) sees an ordinary expression. A written ``H`` never starts with ``*``, so a field
holding one counts as fixed for cronie's DST rule, and a day field holding one as restricted.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

from cronkeeper.timing import fields as f
from cronkeeper.timing.errors import TimingError

_ITEM = re.compile(r"[Hh](?:\((?P<range>[^()]*)\))?(?:/(?P<step>.*))?")
# Bare H (and H/n) in these fields: a range every month and week has, each day once.
_DEFAULT_RANGE = {f.DOM: (1, 28), f.DOW: (0, 6)}


@dataclass(frozen=True, slots=True)
class HashedItem:
    """One ``H`` item: its range (inclusive) and step (None: one value)."""

    low: int
    high: int
    step: int | None

    def text(self, h: int) -> str:
        """The item in the plain grammar, for the field's hash ``h``."""
        if self.step is None:
            return str(self.low + h % (self.high - self.low + 1))
        start = self.low + h % self.step
        return str(start) if start + self.step > self.high else f"{start}-{self.high}/{self.step}"


# A field: its spec and its items, each a plain item's text or an H item.
_Field = tuple[f.FieldSpec, tuple[str | HashedItem, ...]]


def field_hash(name: str, field: str) -> int:
    """The documented hash: SHA-256 of ``name + " " + field``, first 8 bytes, big-endian."""
    return int.from_bytes(hashlib.sha256(f"{name} {field}".encode()).digest()[:8], "big")


def uses_hash(expr: str) -> bool:
    """Whether any list item of ``expr`` starts with ``H`` (no other check)."""
    if "H" not in expr and "h" not in expr:  # the usual case, and the leader's on every trigger
        return False
    return _uses_hash(expr)


@functools.lru_cache(maxsize=32768)
def _uses_hash(expr: str) -> bool:
    return any(item[:1] in ("H", "h") for word in f.SEPARATORS.split(expr.strip(" \t"))
               for item in word.split(","))  # fmt: skip


def _hashed_item(item: str, spec: f.FieldSpec) -> HashedItem:
    field, low, high, _ = spec
    match = _ITEM.fullmatch(item)
    if match is None:
        raise f.fail(field, f"{item!r} is not a hashed value: write H, H(a-b), H/n or H(a-b)/n")
    low, high = _DEFAULT_RANGE.get(field, (low, high))
    inner, step_text = match.group("range"), match.group("step")
    if inner is not None:
        first, dash, last = inner.partition("-")
        if not dash or "-" in last:
            raise f.fail(field, f"{item!r}: H(...) takes a range a-b, such as H(0-29)")
        low = f.value(first, spec)
        high = f.range_end(spec, low, f.value(last, spec))
        if low > high:
            raise f.fail(field, f"range in {item!r} is reversed ({low} > {high})")
    step = None if step_text is None else f.step(step_text, item, spec)
    if step is not None and step > high - low + 1:
        raise f.fail(field, f"step {step} in {item!r} is larger than its range {low}-{high}: "
                            "no start within the step is sure to fall inside it")  # fmt: skip
    return HashedItem(low, high, step)


@functools.lru_cache(maxsize=32768)
def template(expr: str) -> tuple[_Field, ...] | None:
    """The fields of ``expr`` with its ``H`` items read (TimingError naming the field of a
    malformed one), or None when it has none, or is not 5 or 6 fields (the parser says so)."""
    if not uses_hash(expr):
        return None
    words = f.SEPARATORS.split(expr.strip(" \t"))
    specs = {5: f.FIELDS5, 6: f.FIELDS6}.get(len(words))
    if specs is None:
        return None
    return tuple(
        (spec, tuple(_hashed_item(item, spec) if item[:1] in ("H", "h") else item
                     for item in word.split(",")))
        for word, spec in zip(words, specs, strict=True)
    )  # fmt: skip


def resolve(expr: str, name: str | None) -> str:
    """``expr`` with each ``H`` item replaced by its value(s) for the schedule ``name``; an
    expression without ``H`` unchanged. TimingError for a malformed ``H``, or one without a
    name to hash."""
    f.check_characters(expr)
    found = template(expr)
    if found is None:
        return expr
    if name is None:
        raise TimingError("H needs the schedule's name, which it hashes: it is for schedule "
                          "files and runtime schedules only")  # fmt: skip
    words = []
    for spec, items in found:
        if all(isinstance(item, str) for item in items):
            words.append(",".join(str(item) for item in items))
            continue
        h = field_hash(name, spec[0])
        words.append(",".join(item if isinstance(item, str) else item.text(h) for item in items))
    return " ".join(words)
