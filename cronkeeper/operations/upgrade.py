"""``cronkeeper migrate --dry-run``: what ``migrate`` would apply, and whether the instances
running now would keep working on the schema it leaves (docs/upgrading.md)."""

from __future__ import annotations

from dataclasses import dataclass

from cronkeeper.db.engine import Engine, translate_errors
from cronkeeper.db.instances import instances_live
from cronkeeper.db.migrate import FIRST_RELEASE, Migration, pending, release_key, schema_state

# Instances whose heartbeat is this recent count as running (as ``status`` counts them).
LIVE_WITHIN = 30.0


@dataclass(frozen=True, slots=True)
class InstanceVerdict:
    instance_id: str
    kind: str
    version: str
    compatible: bool
    note: str  # what the operator should know or do about this instance


@dataclass(frozen=True, slots=True)
class MigrationPlan:
    schema_version: int  # now
    pending: list[Migration]
    result_version: int  # after ``migrate``
    result_oldest_release: str  # the oldest release that works with the result
    instances: list[InstanceVerdict]

    @property
    def all_compatible(self) -> bool:
        return all(i.compatible for i in self.instances)


def verdict(instance_id: str, kind: str, version: str, oldest: str) -> InstanceVerdict:
    """Would an instance of ``version`` keep working on a schema whose oldest release is
    ``oldest``? A running instance never checks the schema again, so it keeps working when its
    release is that one or newer; 0.1.0, which predates the policy, then refuses to start again."""
    try:
        ours = release_key(version)
    except ValueError:
        return InstanceVerdict(instance_id, kind, version, False,
                               f"version {version!r} is not a release number: check this host")
    if ours < release_key(oldest):
        return InstanceVerdict(instance_id, kind, version, False,
                               f"too old for the result: upgrade it to {oldest} or newer first")
    if ours[:2] == release_key(FIRST_RELEASE)[:2]:
        return InstanceVerdict(instance_id, kind, version, True,
                               "keeps running, but 0.1 refuses any newer schema when it starts: "
                               "after migrate, restart it only as the new release")
    return InstanceVerdict(instance_id, kind, version, True, "keeps running")


def migration_plan(engine: Engine, schema: str, cluster: str) -> MigrationPlan:
    with translate_errors("reading the schema version"), engine.connect() as conn:
        state = schema_state(conn, schema)
        todo = pending(conn, schema)
        live = instances_live(conn, cluster, LIVE_WITHIN) if state.version else []
        conn.rollback()
    oldest = max([state.oldest_release, *(m.oldest_release for m in todo)], key=release_key)
    result = todo[-1].version if todo else state.version
    verdicts = [verdict(i["instance_id"], i["kind"], i["version"], oldest) for i in live]
    return MigrationPlan(state.version, todo, result, oldest, verdicts)
