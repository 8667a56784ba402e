"""What the leader's audit tells as ``missing`` notifications (docs/notifications.md): a period
due beyond its grace with no recorded outcome, not told yet, is noted
(``notifications_note_missing``) in the transaction of the step that found it.

The audit is the summarizer's (``cronkeeper.summarizer``: one audit per schedule and pass serves
``status``, the metrics, the log and this): it asks ``since`` where to start each schedule's
window and hands the rows it judged to ``judge``. A term's first pass looks back ``LOOKBACK``
(24 hours); a later pass only from where the previous one had judged each schedule for good
(its instant less the schedule's grace); and periods told already (``missing_through`` of
``notification_subjects``, read by the summarizer) are not told again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from cronkeeper.audit import HistoryRow, Status, Version
from cronkeeper.db.notifications import Skipped

LOOKBACK = timedelta(hours=24)


class MissingWatch:
    """One per term: where each schedule was judged for good."""

    def __init__(self) -> None:
        self._judged: dict[str, datetime] = {}  # schedule -> judged for good up to here

    def since(self, name: str, now: datetime, told: Mapping[str, datetime]) -> datetime:
        """Where the audit of ``name`` must start for this: 24 hours back, or later where the
        previous pass judged it for good or the latest told period is."""
        floor = now - LOOKBACK
        return max(floor, self._judged.get(name, floor), told.get(name, floor))

    def judge(self, name: str, versions: Sequence[Version], rows: Sequence[HistoryRow],
              start: datetime, now: datetime, told: Mapping[str, datetime]) -> Skipped | None:
        """The notification of ``name``'s missing periods in ``rows`` (the audit from
        ``start``, which may be earlier than ``since``) not told yet; None when none."""
        spec = next((v.spec for v in reversed(versions) if v.spec is not None), None)
        grace = spec.grace if spec is not None else 0.0
        own = self.since(name, now, told)
        self._judged[name] = max(own, now - timedelta(seconds=grace + 1))
        missing = [_instant(r.scheduled_for) for r in rows if r.status == Status.MISSING.value]
        missing = [at for at in missing if at >= own and (name not in told or at > told[name])]
        if not missing:
            return None
        return Skipped(name, spec.task_name if spec else None,
                       spec.owner if spec else None, len(missing), min(missing), max(missing))


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
