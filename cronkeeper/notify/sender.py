"""The sender: a thread of ``cronkeeper run`` and ``cronkeeper worker`` (with ``--notify-config``)
that delivers what the events noted (``db/notifications.py``), at least once.

One notification at a time: claim the oldest due one (``FOR UPDATE SKIP LOCKED``, a lease), work
out its sinks from the rules, and for each sink not yet reached send, then record the answer
at once (``notifications_delivered``: the sink joins ``sent_to``, or ``failed_to`` when it
refused for good, and the lease is renewed). Then settle: ``sent`` when every sink took it,
``failed`` when one refused for good or the tries are spent (at least ``max_attempts`` tries and
``retry_for`` since it was written), else ``pending`` again after a backoff with full jitter
(``cronkeeper.backoff.retry_delay``). So a sender killed mid-send loses nothing (the lease runs
out, another sender claims it) and repeats at most the one sink it was sending to. A sink that
fails but may take it later renews the lease too, so several that time out in a row never let it
run out while this sender still works on the notification.

A notification that cannot be sent is logged (``notification_failed``) and counted
(``cronkeeper_notifications_failed_total{sink}``); nothing notifies about it in turn.

Woken at once by the notes' own channel (``db/wake.py``, LISTEN in ``worker.wakeups``), and
otherwise when the next one falls due or every ``POLL`` seconds. Database access goes through
the lease holders' seam (``claiming.ClaimingDatabase``): outages are said once a minute, and the
sender idles on a schema without the notifications tables (a worker of this release on the
previous release's schema), looking again once a minute.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Mapping

from cronkeeper import clock, metrics
from cronkeeper.backoff import retry_delay
from cronkeeper.claiming import ClaimingDatabase, ReconnectBackoff
from cronkeeper.db import notifications
from cronkeeper.db.engine import Engine
from cronkeeper.db.wake import notes_channel
from cronkeeper.errors import DatabaseError
from cronkeeper.logs import say_survived
from cronkeeper.notify.messages import Message, links
from cronkeeper.notify.model import NotifyConfig, Sink
from cronkeeper.notify.sinks import SendError, send
from cronkeeper.operations.output import last_output_tail
from cronkeeper.outage import Repeats
from cronkeeper.output import split_tail
from cronkeeper.worker.wakeups import Wakeups

log = logging.getLogger("cronkeeper.notify")

POLL = 5.0  # seconds between looks when nothing wakes the sender (the LISTEN is the fast path)


class Sender:
    def __init__(self, engine: Engine, config: NotifyConfig, *, schema: str, sender_id: str,
                 web_url: str | None = None, environ: Mapping[str, str] | None = None) -> None:
        self.engine = engine
        self.config = config
        self.sender_id = sender_id
        self.web_url = web_url
        self.environ = environ if environ is not None else os.environ
        self.db = ClaimingDatabase(engine)
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self.rand = random.Random()
        self.wakeups = Wakeups(engine, schema, POLL, self.poke, self.stopping,
                               channel=notes_channel(schema))
        self.thread = threading.Thread(target=self.run, name="notify-sender", daemon=True)
        self.stats = {"sent": 0, "failed": 0, "retried": 0}
        self._repeats = Repeats()  # the errors it survives (a bug), said once a minute

    def start(self) -> None:
        self.wakeups.start()
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the current send (a send cut short by the process's end is one the lease
        hands to another sender)."""
        self.stopping.set()
        self._wake.set()
        if self.thread.is_alive():
            self.thread.join(timeout)
        self.engine.dispose()

    def poke(self) -> None:
        self._wake.set()

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        backoff = ReconnectBackoff(cap=5.0)
        next_reap = 0.0
        log.info("notification sender started: sinks=%s rules=%d",
                 ",".join(s.name for s in self.config.sinks) or "-", len(self.config.rules),
                 extra={"action": "notify_started"})
        while not self.stopping.is_set():
            wait = POLL
            try:
                if not self.db.has(self.db.notes):
                    self.stopping.wait(self.db.notes.RECHECK)
                    continue
                if clock.monotonic() >= next_reap:
                    with self.db.statement("reaping notification leases") as conn:
                        reaped = notifications.notifications_reap_expired(conn)
                    if reaped:
                        log.warning("notification leases expired: notifications=%d", reaped,
                                    extra={"action": "notify_leases_expired"})
                    next_reap = clock.monotonic() + self.config.lease / 2
                if self.send_one():
                    backoff.reset()
                    continue
                with self.db.statement("finding the next notification") as conn:
                    due = notifications.notifications_next_due(conn)
                backoff.reset()
                if due is not None:
                    wait = min(wait, max(0.0, due) + 0.01)
            except DatabaseError:
                wait = backoff.next()
            except Exception as exc:  # noqa: BLE001 - a bug must not end the sender unseen
                # (the notification in hand comes back when its lease runs out, a try more)
                say_survived(log, self._repeats, "notification sender",
                             "sending notifications", exc, clock.monotonic())
                wait = backoff.next()
            self._wake.wait(wait)
            self._wake.clear()
        self.db.close_kept()

    def send_one(self) -> bool:
        """Claim one due notification and deliver it; False when none was due."""
        cfg = self.config
        with self.db.statement("claiming a notification") as conn:
            note = notifications.notifications_claim(conn, sender=self.sender_id, lease=cfg.lease)
        if note is None:
            return False
        if note.tries > cfg.max_attempts and note.age >= cfg.retry_for:
            # Claimed again after its tries ran out: its sender died on it every time.
            self._settle(note, "failed", error=f"gave up after {note.tries - 1} tries")
            self._gave_up(note, [s.name for s in cfg.sinks_for(
                note.event, note.schedule, note.task, note.owner)
                if s.name not in note.sent_to + note.failed_to], "its senders stopped during it")
            return True
        sinks = [s for s in cfg.sinks_for(note.event, note.schedule, note.task, note.owner)
                 if s.name not in note.sent_to and s.name not in note.failed_to]
        message = self._message(note) if sinks else None
        errors: list[tuple[str, SendError]] = []
        refusals: list[str] = []
        for sink in sinks:
            assert message is not None
            try:
                _send(sink, message, self.environ)
            except SendError as exc:
                if not exc.permanent:
                    errors.append((sink.name, exc))
                    if not self._record(note, sink.name, ok=None):
                        return True
                    continue
                refusals.append(f"{sink.name}: {exc}")
                metrics.current().notification_failed(sink.name)
                log.error("notification not sent: id=%d event=%s subject=%s sink=%s error=%s "
                          "(not retried: the sink refused it for good)", note.id, note.event,
                          message.subject, sink.name, exc,
                          extra={"action": "notification_failed", "schedule": note.schedule,
                                 "sink": sink.name})
                if not self._record(note, sink.name, ok=False):
                    return True
                continue
            metrics.current().notification_sent(sink.name, note.event)
            log.info("notification sent: id=%d event=%s subject=%s sink=%s try=%d", note.id,
                     note.event, message.subject, sink.name, note.tries,
                     extra={"action": "notification_sent", "schedule": note.schedule,
                            "sink": sink.name})
            if not self._record(note, sink.name, ok=True):
                return True
        if not errors:
            if refusals or note.failed_to:
                self._settle(note, "failed", error="; ".join(refusals) or None)
            else:
                self._settle(note, "sent")
            return True
        last = "; ".join(f"{name}: {exc}" for name, exc in errors)
        if note.tries >= cfg.max_attempts and note.age >= cfg.retry_for:
            self._settle(note, "failed", error=last)
            self._gave_up(note, [name for name, _ in errors], last)
            return True
        base, factor, cap = cfg.backoff
        delay = retry_delay(note.tries, base, factor, cap, self.rand.random())
        self.stats["retried"] += 1
        log.warning("notification not sent yet: id=%d event=%s sinks=%s try=%d next in %.1fs: %s",
                    note.id, note.event, ",".join(n for n, _ in errors), note.tries, delay, last,
                    extra={"action": "notification_retry", "schedule": note.schedule})
        self._settle(note, "pending", delay=delay, error=last)
        return True

    def _message(self, note: notifications.Note) -> Message:
        """The notification as it is told: the error apart from the output tail, which comes
        from the job's last attempt (or, failing that, from what its last_error kept)."""
        error, tail = split_tail(note.error) if note.error else (None, "")
        if note.event == "dead" and note.job_id is not None:
            try:
                with self.db.statement("reading a job's output") as conn:
                    tail = last_output_tail(conn, note.job_id) or tail
            except DatabaseError:
                pass  # the tail last_error kept will do
        explain, page = links(self.web_url, note.schedule, note.key)
        return Message(
            id=note.id, event=note.event, schedule=note.schedule, task=note.task,
            owner=note.owner, key=note.key, attempts=note.attempts, error=error,
            output_tail=tail, count=note.count, window_from=note.window_from,
            window_until=note.window_until, at=note.created_at, explain_url=explain,
            schedule_url=page)

    def _record(self, note: notifications.Note, sink: str, *, ok: bool | None) -> bool:
        """Record one sink's answer at once, renewing the lease for the next sink (``ok``
        None: it failed but may take it on a later try: only the lease is renewed, so sinks
        that time out one after another never outlast it); False when the lease was lost
        meanwhile (another sender has the notification: it will not send to this sink again)."""
        try:
            with self.db.statement("recording a notification") as conn:
                if ok is None:
                    held = notifications.notifications_renew(
                        conn, note_id=note.id, tries=note.tries, sender=self.sender_id,
                        lease=self.config.lease)
                else:
                    held = notifications.notifications_delivered(
                        conn, note_id=note.id, tries=note.tries, sender=self.sender_id,
                        sink=sink, ok=ok, lease=self.config.lease)
        except DatabaseError:
            return False  # the lease runs out; another sender sends to this sink again
        if not held:
            log.warning("notification lease lost: id=%d (another sender took it)", note.id,
                        extra={"action": "notify_lease_lost"})
        return held

    def _settle(self, note: notifications.Note, state: str, *, delay: float = 0.0,
                error: str | None = None) -> None:
        try:
            with self.db.statement("settling a notification") as conn:
                age = notifications.notifications_settle(conn, note_id=note.id, tries=note.tries,
                                              sender=self.sender_id, state=state, delay=delay,
                                              error=error)
        except DatabaseError:
            return  # the lease runs out; the sinks recorded stay reached
        if age is not None and state == "sent":
            self.stats["sent"] += 1
            metrics.current().notification_delivered(note.event, age)
        elif state == "failed":
            self.stats["failed"] += 1

    def _gave_up(self, note: notifications.Note, sinks: list[str], why: str) -> None:
        for name in sinks:
            metrics.current().notification_failed(name)
        log.error("notification failed: id=%d event=%s schedule=%s task=%s tries=%d sinks=%s: %s",
                  note.id, note.event, note.schedule, note.task, note.tries, ",".join(sinks), why,
                  extra={"action": "notification_failed", "schedule": note.schedule})


def _send(sink: Sink, message: Message, environ: Mapping[str, str]) -> None:
    """``send``, with anything else a sink raises (a library's bug, an answer no one foresaw)
    turned into a failure worth retrying: one sink never keeps the others from the message."""
    try:
        send(sink, message, environ)
    except SendError:
        raise
    except Exception as exc:  # noqa: BLE001 - a sink's bug must not end the sender
        raise SendError(f"{type(exc).__name__}: {exc}") from None
