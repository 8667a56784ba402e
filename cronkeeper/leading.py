"""The leader's loop: what an elected instance does with its term, until the term ends.

The election (``election.Node``) wins a term and hands it to ``LeaderLoop.lead``, which runs a
``scheduler.Scheduler`` on it::

    load the versions in force ─► catch up (tick until current) ─► adopt the file set
        ─► adopt the runtime schedules (every row looked at)
        ─► loop: adopt a pending set (reload) · adopt runtime changes (when told of a commit,
                 ``runtime_changed``, and every runtime_poll seconds) · tick (heartbeat_url
                 pinged when due, off the loop's thread: ``notify.heartbeat``) · prune every
                 prune_interval (jobs, attempts, periods, notifications, runtime tombstones)
                 · a step of the summarizer (each schedule's figures for status, the web and
                 the metrics, and the audit for missing periods: ``summarizer``) · sleep
                 until the next due instant, a wake, or heartbeat_interval

Each bounded step of work is reported as progress (``Term.progress``: the stall watchdog's
feed; see ``election``). ``lead`` returns when the process stops (the current tick done; the
election then releases the lock) and raises when the term is lost. Writes the database refuses
for want of space or memory do not end the term (``lead``'s docstring).
"""

from __future__ import annotations

import gc
import logging
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from cronkeeper import clock
from cronkeeper.db import prune as dbp
from cronkeeper.db.engine import DRIVER_ERRORS, describe, refuses_writes
from cronkeeper.db.notifications import notifications_prune
from cronkeeper.db.runtime_schedules import runtime_prune
from cronkeeper.db.schedule_pauses import pauses_prune
from cronkeeper.outage import OutageReport, kind_of
from cronkeeper.runtime_adoption import record_calendars
from cronkeeper.schedule.model import ScheduleSet
from cronkeeper.scheduler import Scheduler, TickReport
from cronkeeper.summarizer import Summarizer
from cronkeeper.term import Term
from cronkeeper.versions import LOG_EACH_UP_TO

if TYPE_CHECKING:  # a Pinger is made only with a heartbeat_url (cli.notify.pinger)
    from cronkeeper.notify.heartbeat import Pinger

log = logging.getLogger("cronkeeper.leading")

SUMMARY_ROOM = 0.5  # seconds to the next due fire below which the summarizer's step waits
SUMMARY_WAIT_MAX = 5.0  # ... but never longer than this


@dataclass(frozen=True, slots=True)
class LeaderOptions:
    heartbeat_interval: float = 1.0  # leader heartbeat (and longest sleep between ticks)
    prune_interval: float = 60.0
    retention_jobs_days: float = 14.0
    retention_periods_days: float = 400.0
    prune_batch: int = 1000
    runtime_poll: float = 1.0  # seconds between looks at runtime schedules without a NOTIFY


def _settle_heap() -> None:
    """Collect once, then exempt what survives (specs, triggers, per-schedule state) from future
    collections: the cyclic collector's full passes otherwise walk every schedule's objects
    again and again while a burst allocates its rows. Freed objects are still freed (reference
    counting); only cycles among frozen objects would outlive a reload."""
    gc.collect()
    gc.freeze()


class LeaderLoop:
    """One per daemon process, across its terms: the schedule set to run (``schedules``, and a
    ``reload``-ed one pending), and ``lead`` for each term the election wins.

    ``current`` (an Event) is set once a term has caught up and adopted its schedule set, and
    cleared when the term ends: what a test waits on before it expects fires."""

    def __init__(self, schedules: ScheduleSet, *, options: LeaderOptions = LeaderOptions(),
                 metrics=None, pinger: Pinger | None = None, audit_missing: bool = False) -> None:
        self.schedules = schedules
        self.options = options
        self.metrics = metrics
        # heartbeat_url (docs/notifications.md): beaten after each committed tick of a term
        self.pinger = pinger
        # the summarizer's audit also tells missing periods (notify.missing)
        self.audit_missing = audit_missing
        self.summarizer: Summarizer | None = None  # the current term's (tests read its passes)
        self.term: Term | None = None  # the term being led, None between terms
        self.current = threading.Event()
        self._wake = threading.Event()
        self._runtime = threading.Event()  # a runtime schedule change was committed
        self._pending: ScheduleSet | None = None
        self._refused = OutageReport()  # the term's: writes the database refuses (``lead``)

    # -- from other threads ---------------------------------------------------------------------
    def reload(self, schedules: ScheduleSet) -> None:
        if self.term is None:
            self.schedules = schedules  # a standby reports the digest of what it would run
        self._pending = schedules
        self._wake.set()

    def runtime_changed(self) -> None:
        """A runtime schedule change was committed (the listener heard its NOTIFY): look now."""
        self._runtime.set()
        self._wake.set()

    def wake(self) -> None:
        """Cut the current sleep short (a stop: ``Term.stopping`` is checked on waking)."""
        self._wake.set()

    def digest(self) -> str:
        """The digest of the set this instance runs (or would run, as a standby)."""
        return self.schedules.digest

    # -- the term -------------------------------------------------------------------------------
    def lead(self, term: Term) -> None:
        """Lead until stopped or the term is lost. A write the database refuses for want of
        space or memory (``refuses_writes``) does not end the term: no other instance could
        write either, so stepping down and winning again would only flap (a term per backoff
        step). The leader keeps its lock, rolls back, says so once a minute
        (``cronkeeper.outage``), and starts the term's work again from the database after a
        backoff short enough that neither the standbys nor its own watchdog take it for stuck
        (each start heartbeats first)."""
        self.term, self._refused = term, OutageReport()
        delay = 0.2
        cap = min(5.0, term.quiet_limit / 2)
        try:
            while True:
                try:
                    self._lead_once(term)
                    return
                except DRIVER_ERRORS as exc:
                    if term.stopping.is_set() or not refuses_writes(exc) or term.conn.closed \
                            or term.conn.broken:
                        raise
                    self._say_refused(exc, delay, term.number)
                term.progress()  # holding on, not stuck
                if term.stopping.wait(delay):
                    return
                term.progress()
                delay = min(delay * 2, cap)
        finally:
            self.term = None
            self.current.clear()

    def _lead_once(self, term: Term) -> None:
        scheduler = Scheduler(
            term, on_tick=lambda report: self._report(report, term, scheduler),
            resume_floor=timedelta(days=self.options.retention_periods_days),
        )
        scheduler.load_versions()
        scheduler.tick_until_current()  # periods due under the versions in force, up to now
        if not scheduler.behind:  # (a stop cut the catch-up short: adopting now would leave a gap)
            scheduler.adopt(self.schedules)
            record_calendars(term, self.schedules)
            scheduler.adopt_runtime()
        _settle_heap()
        self.current.set()
        log.info("leading: %d schedules in force", len(scheduler.states),
                 extra={"action": "leading", "term": term.number})
        next_prune = clock.monotonic()
        summarizer = self.summarizer = Summarizer(notify=self.audit_missing)
        stepped = clock.monotonic()
        next_look = clock.monotonic() + self.options.runtime_poll
        while not term.stopping.is_set():
            pending, self._pending = self._pending, None
            if pending is not None:
                scheduler.tick_until_current()
                if scheduler.behind:  # stopping mid catch-up: the new set waits for the next leader
                    break
                scheduler.adopt(pending)
                record_calendars(term, pending)
                self.schedules = pending
                _settle_heap()
            if self._runtime.is_set() or clock.monotonic() >= next_look:
                self._runtime.clear()
                scheduler.adopt_runtime()
                next_look = clock.monotonic() + self.options.runtime_poll
            report = scheduler.tick()
            term.progress()
            if clock.monotonic() >= next_prune:
                prune(term, self.options)
                next_prune = clock.monotonic() + self.options.prune_interval
            upcoming = scheduler.next_due()
            room = None if upcoming is None else (upcoming - report.now).total_seconds()
            measured = clock.monotonic()
            # a step of the summarizer when no fire is due within it, or when none has run for
            # SUMMARY_WAIT_MAX (a schedule due every second leaves no room)
            if room is None or room > SUMMARY_ROOM \
                    or clock.monotonic() - stepped > SUMMARY_WAIT_MAX:
                summarizer.step(term, scheduler.states, scheduler.states)
                stepped = clock.monotonic()
            wait = self.options.heartbeat_interval
            if room is not None:  # less what the step took
                wait = min(wait, max(0.0, room - (clock.monotonic() - measured)) + 0.001)
            self._wake.wait(wait)
            self._wake.clear()
        # graceful stop: the current tick is done; the election hands the lock over

    # -- what the term says ---------------------------------------------------------------------
    def _say_refused(self, exc: BaseException, delay: float, term: int) -> None:
        """Writes refused: said when it begins or changes kind, then once a minute
        (``cronkeeper.outage``); the first tick that commits says it is over (``_report``)."""
        notice = self._refused.failed(clock.monotonic(), kind_of(describe(exc)))
        if notice is not None and notice.first:
            log.warning("database refuses writes: %s; keeping leadership, retrying in %.1fs "
                        "(said again each minute while it lasts)", describe(exc), delay,
                        extra={"action": "db_unavailable", "term": term})
        elif notice is not None:
            log.warning("database still refuses writes: %s; for %.0fs, %d failed tries",
                        describe(exc), notice.lasted, notice.failures,
                        extra={"action": "db_unavailable", "term": term})

    def _report(self, report: TickReport, term: Term, scheduler: Scheduler | None = None) -> None:
        """A committed tick: progress, the heartbeat ping, its log lines, its metrics."""
        term.progress()
        if self.pinger is not None:
            self.pinger.beat()
        if self._refused.down:  # writes refused (``lead``), and now one committed
            notice = self._refused.recovered(clock.monotonic())
            assert notice is not None
            log.warning("database accepts writes again after %.1fs (%d failed tries)",
                        notice.lasted, notice.failures,
                        extra={"action": "db_reconnected", "term": term.number})
        decisions = report.decisions
        # A line per period costs ~15 us: fine for a few, a second of the leader's time for a
        # burst of 100,000. Past LOG_EACH_UP_TO, one summary line at info, each period at debug.
        each = len(decisions) <= LOG_EACH_UP_TO
        if not each:
            fired = sum(1 for _, d, _ in decisions if d.reason is None)
            skipped = Counter(str(d.reason) for _, d, _ in decisions if d.reason is not None)
            log.info(
                "fired %d jobs, skipped %d periods%s in one tick", fired, len(decisions) - fired,
                "".join(f", {n} {r}" for r, n in sorted(skipped.items())),
                extra={"action": "fire_batch", "term": term.number},
            )
        fire_level = logging.INFO if each else logging.DEBUG
        skip_level = logging.WARNING if each else logging.DEBUG
        if each or log.isEnabledFor(logging.DEBUG):
            for schedule, decision, job_id in decisions:
                if decision.reason is None:
                    log.log(
                        fire_level, "fired %s", schedule,
                        extra={"action": "fire", "schedule": schedule, "term": term.number,
                               "scheduled_for": decision.scheduled_for.isoformat(),
                               "job_id": job_id},
                    )
                else:
                    log.log(
                        skip_level, "skipped %s (%s)", schedule, decision.reason,
                        extra={"action": "skip", "schedule": schedule, "term": term.number,
                               "scheduled_for": decision.scheduled_for.isoformat(),
                               "reason": str(decision.reason)},
                    )
        if report.lost:
            log.warning(
                "%d periods were already decided by another leader; emitted nothing for them",
                report.lost, extra={"action": "claim_lost", "term": term.number},
            )
        if self.metrics is not None:
            states = scheduler.states if scheduler is not None else {}  # runtime ones' owners
            self.metrics.observe_tick(report, self.schedules, owner_of=lambda name: (
                states[name].spec.owner if name in states else None))


def prune(term: Term, options: LeaderOptions) -> None:
    """Each retention's rows past their days, a batch of each, in one fenced transaction."""
    with term.conn.transaction():
        term.confirm()
        counts = dbp.prune(term.conn, jobs_days=options.retention_jobs_days,
                           periods_days=options.retention_periods_days,
                           batch=options.prune_batch)
        notes = notifications_prune(term.conn, days=options.retention_jobs_days,
                                    batch=options.prune_batch)
        gone = runtime_prune(term.conn, days=options.retention_jobs_days,
                             batch=options.prune_batch)  # deleted runtime schedules
        spans = pauses_prune(term.conn, days=options.retention_periods_days,
                             batch=options.prune_batch)  # with the periods they judged
    if any(counts) or notes or gone or spans:
        log.info("pruned jobs=%d attempts=%d periods=%d notifications=%d tombstones=%d "
                 "pause_spans=%d", *counts, notes, gone, spans, extra={"action": "pruned"})
