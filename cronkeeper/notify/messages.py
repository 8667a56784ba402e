"""What each sink receives (docs/notifications.md documents every field): pure functions of a
``Message``, the notification as it is told.

- ``webhook_body``: the JSON document (the contract: ``event``, ``schedule``, ``task``,
  ``owner``, ``key``, ``attempts``, ``error``, ``output_tail``, ``count``, ``window``,
  ``explain_url``, plus ``id``, ``at`` and ``schedule_url``), and ``signature`` its HMAC;
- ``slack_body``: an incoming webhook's JSON, ``text`` (the fallback shown in notifications)
  plus ``blocks``;
- ``email_message``: an e-mail whose subject names the event and the schedule, with a
  Message-ID that is the same each time the notification is sent (a repeat after a crash reads
  as the same message);
- ``title`` and ``text``: the plain form (e-mail body, Apprise).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Any
from urllib.parse import quote

SIGNATURE_HEADER = "X-Cronkeeper-Signature"
SLACK_SECTION_MAX = 3000  # characters Slack takes in one section's text
SLACK_TAIL_MAX = 2500


@dataclass(frozen=True, slots=True)
class Message:
    """A notification as it is told: the event's facts, and what the sender adds at send time
    (the output tail of the job's last attempt, links to the web)."""

    id: int
    event: str
    schedule: str | None
    task: str | None
    owner: str | None
    key: str | None
    attempts: int | None
    error: str | None
    output_tail: str
    count: int
    window_from: datetime | None
    window_until: datetime | None
    at: datetime
    explain_url: str | None = None
    schedule_url: str | None = None

    @property
    def subject(self) -> str:
        """What the event is about: the schedule, or ``task NAME`` for a job without one."""
        if self.schedule is not None:
            return self.schedule
        return f"task {self.task}"


def links(web_url: str | None, schedule: str | None, key: str | None) -> tuple[str | None, str | None]:
    """(explain_url, schedule_url) on the web (``cronkeeper web``) at ``web_url`` (None: none)."""
    if not web_url:
        return None, None
    base = web_url.rstrip("/")
    explain = f"{base}/explain/{quote(key, safe='@:')}" if key else None
    page = f"{base}/schedules/{quote(schedule, safe='')}" if schedule else None
    return explain, page


def _instant(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def headline(m: Message) -> str:
    """One line saying what happened."""
    window = (f" from {_instant(m.window_from)} to {_instant(m.window_until)}"
              if m.window_from is not None else "")
    if m.event == "dead":
        first = (m.error or "").strip().splitlines()[0:1]
        why = f": {first[0]}" if first else ""
        tries = f" after {_plural(m.attempts, 'attempt')}" if m.attempts else ""
        return f"{m.subject}: job {m.key} is a dead letter{tries}{why}"
    if m.event == "recovered":
        more = (f"; {_plural(m.count, 'more dead letter')} meanwhile, not sent one by one"
                if m.count else "")
        return f"{m.subject} recovered: job {m.key} succeeded{more}"
    if m.event == "missed":
        return (f"{m.subject}: {_plural(m.count, 'period')} missed (no leader in time; skipped "
                f"by its misfire policy){window}")
    return (f"{m.subject}: {_plural(m.count, 'period')} missing (due beyond grace, no recorded "
            f"outcome){window}")


def title(m: Message) -> str:
    """The e-mail subject (and Apprise title): the event and the schedule, on one line (a task
    name is any string an application gave, and a header may hold no line break)."""
    return " ".join(f"[cronkeeper] {m.event}: {m.subject}".split())


def text(m: Message) -> str:
    """The plain body: the headline, the facts, the error, the output tail, the links."""
    lines = [headline(m), ""]
    facts = [("event", m.event), ("schedule", m.schedule), ("task", m.task),
             ("owner", m.owner), ("key", m.key),
             ("attempts", None if m.attempts is None else str(m.attempts)),
             ("count", str(m.count)),
             ("window", f"{_instant(m.window_from)} .. {_instant(m.window_until)}"
              if m.window_from is not None else None),
             ("at", _instant(m.at)), ("explain", m.explain_url), ("schedule page", m.schedule_url)]
    lines += [f"{name}: {value}" for name, value in facts if value is not None]
    if m.error:
        lines += ["", "error:", m.error]
    if m.output_tail:
        lines += ["", "output (last lines):", m.output_tail]
    return "\n".join(lines) + "\n"


def webhook_body(m: Message) -> bytes:
    """The webhook's JSON document, as bytes (what the signature signs)."""
    window = ({"from": _instant(m.window_from), "until": _instant(m.window_until)}
              if m.window_from is not None else None)
    doc: dict[str, Any] = {
        "id": m.id, "event": m.event, "schedule": m.schedule, "task": m.task, "owner": m.owner,
        "key": m.key, "attempts": m.attempts, "error": m.error, "output_tail": m.output_tail,
        "count": m.count, "window": window, "at": _instant(m.at),
    }
    if m.explain_url is not None or m.schedule_url is not None:
        doc["explain_url"] = m.explain_url
        doc["schedule_url"] = m.schedule_url
    return json.dumps(doc, ensure_ascii=False).encode()


def signature(body: bytes, secret: str) -> str:
    """``sha256=<hex HMAC-SHA256 of the body>`` (the X-Cronkeeper-Signature header)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _mrkdwn(value: str) -> str:
    """Slack's escaping: only &, < and > are special in text."""
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _code(value: str, most: int) -> str:
    """A preformatted block (a triple backtick inside cannot end it early)."""
    if len(value) > most:
        value = "…" + value[-most:]
    return "```" + _mrkdwn(value.replace("```", "`\u200b``")) + "```"


def slack_body(m: Message) -> dict[str, Any]:
    """An incoming webhook's message: ``text`` plus ``blocks`` (a section with the headline, the
    facts as fields, the error and output tail preformatted, the links)."""
    headline_text = headline(m)
    fields = [("Schedule", m.schedule), ("Task", m.task), ("Owner", m.owner), ("Key", m.key),
              ("Attempts", None if m.attempts is None else str(m.attempts)),
              ("Count", str(m.count) if m.event != "dead" else None)]
    if m.window_from is not None:
        fields.append(("Window", f"{_instant(m.window_from)} .. {_instant(m.window_until)}"))
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn",
                                     "text": _mrkdwn(headline_text)[:SLACK_SECTION_MAX]}},
        {"type": "section", "fields": [
            {"type": "mrkdwn", "text": f"*{name}*\n{_mrkdwn(value)}"[:2000]}
            for name, value in fields if value is not None][:10]},
    ]
    if m.error:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "*Error*\n" + _code(
            m.error, SLACK_SECTION_MAX - 40)}})
    if m.output_tail:
        blocks.append({"type": "section", "text": {"type": "mrkdwn",
                                                   "text": "*Output (last lines)*\n" + _code(
                                                       m.output_tail, SLACK_TAIL_MAX)}})
    links_text = " · ".join(f"<{url}|{label}>" for label, url in (
        ("explain", m.explain_url), ("schedule", m.schedule_url)) if url)
    context = f"cronkeeper · {m.event} · {_instant(m.at)}"
    blocks.append({"type": "context", "elements": [
        {"type": "mrkdwn", "text": context + (f" · {links_text}" if links_text else "")}]})
    return {"text": headline_text[:SLACK_SECTION_MAX], "blocks": blocks}


def email_message(m: Message, *, sender: str, to: list[str], sink: str) -> EmailMessage:
    """The e-mail for ``to``; its Message-ID is derived from the notification and the sink,
    so a repeat (a sender that died before recording the send) has the same one."""
    msg = EmailMessage()
    msg["Subject"] = title(m)
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    msg["Date"] = format_datetime(m.at.astimezone(UTC))
    domain = sender.rpartition("@")[2] or "cronkeeper.invalid"
    msg["Message-ID"] = f"<cronkeeper.notification.{m.id}.{sink}@{domain}>"
    msg["X-Cronkeeper-Event"] = m.event
    if m.schedule is not None:
        msg["X-Cronkeeper-Schedule"] = m.schedule
    msg.set_content(text(m))
    return msg
