"""How long `cronkeeper validate DIR` takes on N schedules in 100 files (SPEC §3: 10,000 < 2 s;
issue 14: 100,000 < 2 s).

Generates varied, valid schedules (cron and every, a dozen zones, tasks and commands, payloads,
backoff tables, some DST-gap warnings) in a temporary directory, then runs the real console
script as a subprocess, Python start-up included, and prints the best and median of the runs,
wall clock and CPU (user + system of the subprocess: what it costs whatever the load), and the
load average.

    .venv/bin/python benchmarks/validate_10k.py [--runs 3] [--schedules 10000] [--files 100]
        [--forms plain|extended] [--calendar DATES]

``--forms extended`` writes every cron with cronkeeper's H, L or # (issue 25): ``H H * * *``,
``H(0-29) 2 * * *`` (a hashed time in New York's and Berlin's DST gaps: warnings), ``H/15``,
``L``, ``L-3``, ``5L``, ``mon#2`` ..., so each schedule's H is resolved from its own name.

``--calendar 50`` adds a file ``calendars.toml`` defining one calendar of that many dates (from
the coming weeks over the next two years) and names it in every schedule, half of them with
``on_calendar = "next_day"`` (issue 25: 10,000 such schedules validate in under 2 s).
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ZONES = (
    "UTC", "America/New_York", "America/Los_Angeles", "America/Sao_Paulo", "Europe/Berlin",
    "Europe/London", "Europe/Paris", "Asia/Tokyo", "Asia/Kolkata", "Australia/Sydney",
    "Pacific/Auckland", "Africa/Cairo",
)  # fmt: skip
TEAMS = ("billing", "platform", "growth", "sre", "data", "search", "payments", "identity")


def cron_for(rng: random.Random) -> str:
    minute, hour = rng.randrange(60), rng.randrange(24)
    return rng.choice(
        (
            f"{minute} {hour} * * *",
            f"{minute} * * * *",
            f"*/{rng.choice((5, 10, 15, 30))} * * * *",
            f"{minute} {hour} * * {rng.choice(('mon', '1-5', 'sat,sun', '0'))}",
            f"{minute} {hour} {rng.randrange(1, 29)} * *",
            f"{minute} {hour}-{min(hour + 4, 23)} * * *",
            rng.choice(("@hourly", "@daily", "@weekly", "@monthly")),
        )
    )


def extended_cron_for(rng: random.Random) -> str:
    minute, hour = rng.randrange(60), rng.randrange(24)
    return rng.choice(
        (
            "H H * * *",
            f"H {hour} * * *",
            "H(0-29) 2 * * *",
            "H/15 * * * *",
            f"H(0-29)/10 H(9-17) * * {rng.choice(('mon-fri', '1-5', 'sat,sun'))}",
            f"{minute} {hour} L * *",
            f"H H L-{rng.randrange(0, 8)} * *",
            f"{minute} {hour} * * {rng.choice(('5L', 'friL', '0L', '1#1', 'mon#2', '3#3,3#4'))}",
            f"H {hour} 1,15 * {rng.choice(('5L', 'mon#2'))}",
            "H H H * *",
            "H H * * H",
        )
    )


def calendar_file(dates: int, rng: random.Random) -> str:
    first = datetime.date.today() + datetime.timedelta(days=40)
    days = sorted(rng.sample(range(730), dates))
    listed = ", ".join(f'"{first + datetime.timedelta(days=d)}"' for d in days)
    return f"[calendars.holidays]\ndates = [{listed}]\n"


def schedule(rng: random.Random, name: str, forms: str = "plain", calendar: bool = False) -> str:
    team = rng.choice(TEAMS)
    lines = [f"[{name}]"]
    if forms == "extended":
        lines.append(f'cron = "{extended_cron_for(rng)}"')
    elif rng.random() < 0.2:
        lines.append(f'every = "{rng.choice(("30s", "90s", "5m", "15m", "1h", "6h"))}"')
    else:
        lines.append(f'cron = "{cron_for(rng)}"')
    lines.append(f'timezone = "{rng.choice(ZONES)}"')
    misfire = rng.choice(("skip", "catch_up", "latest"))
    lines.append(f'misfire = "{misfire}"')
    if misfire == "catch_up" and rng.random() < 0.5:
        lines.append(f'catch_up_limit = "{rng.choice(("1h", "6h", "2d"))}"')
    lines.append(f'overlap = "{rng.choice(("skip", "skip", "serial", "allow"))}"')
    if rng.random() < 0.25:
        lines.append(f'command = ["/usr/local/bin/{team}-job", "--shard", "{rng.randrange(64)}"]')
        if rng.random() < 0.5:
            lines.append("permanent_exit_codes = [3, 4]")
    else:
        lines.append(f'task = "{team}.tasks:{name.replace("-", "_")}"')
    lines.append(f'payload = {{ team = "{team}", shard = {rng.randrange(64)}, dry_run = false }}')
    lines.append(f'timeout = "{rng.choice(("30s", "5m", "10m", "1h"))}"')
    if rng.random() < 0.5:
        lines.append(f"max_attempts = {rng.randrange(1, 10)}")
        lines.append('backoff = { base = "30s", factor = 2, max = "1h" }')
    lines.append(f'owner = "team-{team}"')
    lines.append(f'description = "Generated schedule {name} for the {team} team"')
    if calendar:
        lines.append('calendar = "holidays"')
        if rng.random() < 0.5:
            lines.append('on_calendar = "next_day"')
    return "\n".join(lines) + "\n"


def generate(directory: str, schedules: int, files: int, seed: int = 42,
             forms: str = "plain", calendar: int = 0) -> None:
    rng = random.Random(seed)
    if calendar:
        with open(os.path.join(directory, "calendars.toml"), "w", encoding="utf-8") as out:
            out.write(calendar_file(calendar, rng))
    per_file = schedules // files
    n = 0
    for f in range(files):
        path = os.path.join(directory, f"team-{f:03d}.toml")
        with open(path, "w", encoding="utf-8") as out:
            for _ in range(per_file):
                out.write(schedule(rng, f"job-{n:05d}", forms, calendar > 0) + "\n")
                n += 1
        os.chmod(path, 0o644)  # files with `command` must not be group- or world-writable
    os.chmod(directory, 0o755)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--forms", choices=["plain", "extended"], default="plain",
                        help="extended: every cron uses H, L or # (issue 25)")
    parser.add_argument("--calendar", type=int, default=0, metavar="DATES",
                        help="every schedule names one calendar of this many dates (issue 25)")
    args = parser.parse_args()
    script = os.path.join(os.path.dirname(sys.executable), "cronkeeper")
    with tempfile.TemporaryDirectory() as directory:
        generate(directory, args.schedules, args.files, forms=args.forms, calendar=args.calendar)
        size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
        times, cpus = [], []
        for _ in range(args.runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            proc = subprocess.run([script, "validate", directory], capture_output=True, text=True)
            times.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            if proc.returncode != 0:
                sys.exit(f"validate failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}"
                         f"{proc.stderr[-2000:]}")  # fmt: skip
        print(proc.stdout.strip().splitlines()[-1])
        print(
            f"validate {args.schedules} schedules ({args.forms} crons"
            f"{f', a calendar of {args.calendar} dates' if args.calendar else ''}) in "
            f"{args.files} files "
            f"({size / 1e6:.1f} MB): "
            f"best {min(times):.3f} s, median {statistics.median(times):.3f} s "
            f"over {args.runs} runs (limit 2 s); CPU best {min(cpus):.3f} s, median "
            f"{statistics.median(cpus):.3f} s; load average {os.getloadavg()[0]:.2f}"
        )


if __name__ == "__main__":
    main()
