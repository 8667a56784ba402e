"""A partition the kernel feels: the leader's link to PostgreSQL goes down and nothing says
goodbye (no FIN, no RST, no ICMP reaches the server).

Two network namespaces, created and removed by the test, hold every address it uses:
``ckd-*`` runs a private PostgreSQL (listening on its loopback and on its end of a veth pair)
and the standby (over that loopback); ``ckl-*`` runs the leader, which reaches PostgreSQL only
over the veth pair's /30. The test itself talks to the server through its Unix socket, which
the filesystem shares across namespaces, so the root namespace gets no address at all.

The cut is ``ip link set DEV down`` on the leader's end, inside its namespace. What that does,
checked on this kernel before this test was written (a socket pair across the link):
- the server's end sees nothing: its veth end loses carrier, which TCP ignores, so no RST or
  FIN is ever sent or received, and its socket learns of the loss only from its own keepalive
  timer (``Connection timed out`` after idle 5 s + 2 s x 3 probes);
- the leader's end: its established sockets get no error either (a send is queued and
  retransmitted, a read just waits), only new connections fail at once (``Network is
  unreachable``, the route left with the link). ``tc qdisc ... netem loss 100%`` would have
  cut both ways without even that, but this kernel is built without netem.

Run with ``--leader-timeout 30`` (above the TCP bound of 11 s, so the server's keepalives,
or its TCP user timeout for data left unacknowledged at the cut, must be what ends the old
leader's lock session, as the server's log shows) and with the default 10 s (whichever is
first: there the idle-session timeout). When its ARP entry for the leader expires, the
server's own kernel records "No route to host" as a soft error: that ends nothing by itself,
it is only the reason the timer's expiry is reported with.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from daemon_harness import (
    Daemon,
    PrivatePostgres,
    assert_audit_clean,
    audit,
    db_now,
    leader_row,
    lock_sessions,
    schedule_toml,
    set_path,
    wait_for,
    wait_new_leader,
    write_schedules,
)

from cronkeeper.db.engine import DEAD_PEER_SECONDS

# Inside the namespaces only (nothing routes there from the host): the server's end and the
# leader's end of the link.
DB_ADDRESS, LEADER_ADDRESS, PREFIX = "10.213.77.1", "10.213.77.2", 30


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@dataclass(frozen=True, slots=True)
class Link:
    db_ns: str
    leader_ns: str
    leader_dev: str

    def in_ns(self, ns: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]

    def cut(self) -> None:
        self._set("down")

    def heal(self) -> None:
        self._set("up")

    def _set(self, state: str) -> None:
        result = ip("-n", self.leader_ns, "link", "set", self.leader_dev, state)
        assert result.returncode == 0, f"ip link set {self.leader_dev} {state}: {result.stderr}"


@pytest.fixture
def link() -> Iterator[Link]:
    suffix = uuid.uuid4().hex[:8]
    created = Link(db_ns=f"ckd-{suffix}", leader_ns=f"ckl-{suffix}", leader_dev=f"ckl{suffix}")
    db_dev = f"ckd{suffix}"
    steps = [
        ("netns", "add", created.db_ns),
        ("netns", "add", created.leader_ns),
        ("link", "add", db_dev, "netns", created.db_ns, "type", "veth",
         "peer", "name", created.leader_dev, "netns", created.leader_ns),
        ("-n", created.db_ns, "addr", "add", f"{DB_ADDRESS}/{PREFIX}", "dev", db_dev),
        ("-n", created.leader_ns, "addr", "add", f"{LEADER_ADDRESS}/{PREFIX}", "dev", created.leader_dev),
        ("-n", created.db_ns, "link", "set", "lo", "up"),
        ("-n", created.leader_ns, "link", "set", "lo", "up"),
        ("-n", created.db_ns, "link", "set", db_dev, "up"),
        ("-n", created.leader_ns, "link", "set", created.leader_dev, "up"),
    ]
    try:
        for step in steps:
            try:
                result = ip(*step)
            except OSError as exc:
                result = subprocess.CompletedProcess(step, 127, "", str(exc))
            if result.returncode != 0:
                pytest.fail(
                    f"cannot build the partition on this machine: `ip {' '.join(step)}` failed "
                    f"({result.returncode}): {result.stderr.strip()}. This test needs root and a "
                    "kernel with network namespaces and veth; the loopback partition test "
                    "(tests/test_daemon_partition.py) does not.", pytrace=False)
        yield created
    finally:
        for ns in (created.leader_ns, created.db_ns):  # removing a namespace removes its veth end
            ip("netns", "del", ns)


@pytest.fixture(params=[30.0, 10.0], ids=["leader-timeout-30s", "leader-timeout-default"])
def leader_timeout(request: pytest.FixtureRequest) -> float:
    """30 s: above the TCP bound, so the kernel's timers alone must free the lock (a standby's
    deposal and the idle-session timeout come later). 10 s, the default: whichever is first."""
    return request.param


@pytest.fixture
def cluster(link: Link, tmp_path: Path, leader_timeout: float) -> Iterator[tuple]:
    pg = PrivatePostgres(netns=link.db_ns, listen_addresses=f"127.0.0.1,{DB_ADDRESS}")
    daemons: list[Daemon] = []
    db: psycopg.Connection | None = None
    try:
        pg.start()
        schema = pg.new_schema()
        schedules = write_schedules(tmp_path / "schedules", {"p.toml": schedule_toml(
            "every-second", cron="* * * * * *")})
        name = f"c-{uuid.uuid4().hex[:8]}"
        common = dict(schema=schema, cluster=name, schedules=schedules, log_dir=tmp_path,
                      leader_timeout=leader_timeout)
        leader = Daemon(url=pg.tcp_url(DB_ADDRESS), instance_id="in-netns", **common)
        leader.argv = link.in_ns(link.leader_ns, leader.argv)
        standby = Daemon(url=pg.tcp_url("127.0.0.1"), instance_id="standby", **common)
        standby.argv = link.in_ns(link.db_ns, standby.argv)
        daemons += [leader, standby]
        db = set_path(pg.connect(), schema)
        yield pg, db, name, schema, leader, standby
    finally:
        with contextlib.suppress(AssertionError):
            link.heal()
        for d in daemons:
            d.kill()
        if db is not None:
            db.close()
        pg.stop()  # before the namespace goes: a process keeps a deleted namespace alive


def test_a_leader_whose_link_goes_silent_loses_its_lock_and_rejoins(link, cluster, leader_timeout):
    pg, db, name, schema, leader, standby = cluster
    bound = min(leader_timeout, DEAD_PEER_SECONDS) + 2  # docs/operations.md, "Timeouts and bounds"
    leader.start()
    first = wait_for(lambda: (r := leader_row(db, name)) and r.instance_id == "in-netns" and r,
                     30, "the instance in the namespace to lead")
    standby.start()
    wait_for(lambda: lock_sessions(db, schema, name) == {"in-netns": True, "standby": False}, 30,
             "the standby to wait on the lock")
    wait_for(lambda: periods_of(db, first.term) >= 3, 15, "the first leader to fire")

    cut_at, cut_clock = db_now(db), time.monotonic()
    link.cut()
    new = wait_new_leader(db, name, first.term, leader_timeout + 10, "the standby to lead")
    takeover = (new.since - cut_at).total_seconds()
    ended_by = session_end(pg, first.backend_pid)
    print(f"\nlink cut, --leader-timeout {leader_timeout:.0f}: the standby led {takeover:.2f} s "
          f"later (bound {bound:.0f} s); the server ended the old lock session by {ended_by}")
    assert new.instance_id == "standby"
    if leader_timeout > DEAD_PEER_SECONDS:
        assert ended_by == "TCP timeout", (
            f"the old leader's session was ended by {ended_by}, not by the server's TCP timers\n"
            f"{pg.logfile.read_text()[-3000:]}")
        assert not [r for r in standby.records() if r.get("action") == "leader_deposed"]
    assert takeover < bound, f"takeover took {takeover:.2f} s, over the bound of {bound:.0f} s"
    # The cut-off leader gives its session up by the same TCP timers (its query is left
    # unacknowledged): it stops counting itself leader while still cut off.
    lost = leader.wait_log(lambda r: r.get("action") == "leader_lost", DEAD_PEER_SECONDS + 10,
                           "the cut-off leader to see it lost its session")
    knew_after = time.monotonic() - cut_clock
    print(f"the cut-off leader knew within {knew_after:.1f} s ({lost['message']})")
    assert knew_after < DEAD_PEER_SECONDS + 3, f"the cut-off leader knew after {knew_after:.1f} s"
    wait_for(lambda: periods_of(db, new.term) >= 3, 15, "the new leader to fire")
    old_periods = periods_of(db, first.term)

    link.heal()  # what the cut-off leader queued now reaches a session that is gone
    wait_for(lambda: lock_sessions(db, schema, name) == {"in-netns": False, "standby": True}, 60,
             "the healed instance to wait on the lock as a standby")
    healed_at = db_now(db)
    wait_for(lambda: db.execute(
        "SELECT role = 'standby' AND heartbeat_at > %s FROM instances"
        " WHERE cluster = %s AND instance_id = 'in-netns'", (healed_at, name)).fetchone()[0],
        15, "the healed instance's row to say standby")
    assert periods_of(db, first.term) == old_periods
    assert db.execute("SELECT count(*) FROM periods WHERE term = %s AND decided_at >= %s",
                      (first.term, cut_at)).fetchone()[0] == 0
    assert db.execute(
        "SELECT count(*) FROM outbox o JOIN periods p USING (schedule, scheduled_for)"
        " WHERE p.term = %s AND o.created_at >= %s", (first.term, cut_at)).fetchone()[0] == 0
    assert leader_row(db, name).term == new.term
    # Its log: one win (the first term), that term lost, and nothing it says it fired that the
    # database does not hold under its term.
    records = leader.records()
    assert [r.get("term") for r in records if r.get("action") == "leader_won"] == [first.term]
    assert lost.get("term") == first.term
    fired = {r["scheduled_for"] for r in records if r.get("action") == "fire"}
    held = {row[0].isoformat() for row in db.execute(
        "SELECT scheduled_for FROM periods WHERE term = %s", (first.term,))}
    assert fired and fired <= held, sorted(fired - held)
    assert leader.alive() and standby.alive()
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not audit(db, margin=2.0).missing, 20, "every due period decided")
    assert_audit_clean(db, margin=2.0, context="after a silent partition of the leader")


def periods_of(db: psycopg.Connection, term: int) -> int:
    return db.execute("SELECT count(*) FROM periods WHERE term = %s", (term,)).fetchone()[0]


# What the server logs when it ends a session, by mechanism (the default log_line_prefix
# '%m [%p] ' names the backend's pid).
_ENDINGS = {
    # Keepalives unanswered (an idle connection) or data unacknowledged (the user timeout). The
    # kernel reports the timer's expiry with the last soft error it saw, if any: here the
    # neighbour stopped answering ARP, hence "No route to host" (a soft error alone ends
    # nothing: without the timers the session lived until the idle-session timeout).
    "TCP timeout": r"could not receive data from client: (Connection timed out|No route to host)",
    "idle-session timeout": "terminating connection due to idle-session timeout",
    "idle-in-transaction timeout": "terminating connection due to idle-in-transaction timeout",
    "deposal (pg_terminate_backend)": "terminating connection due to administrator command",
}


def session_end(pg: PrivatePostgres, pid: int) -> str:
    def found() -> str | None:
        for line in pg.logfile.read_text().splitlines():
            if re.search(rf"\[{pid}\]", line):
                for mechanism, text in _ENDINGS.items():
                    if re.search(text, line):
                        return mechanism
        return None
    try:
        return wait_for(found, 10, f"the server to log how backend {pid} ended")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its log:\n{pg.logfile.read_text()[-3000:]}") from None
