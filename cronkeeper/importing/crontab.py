"""A crontab, read as cronie reads it, into schedule entries (docs/import.md). Pure: text in.

Line by line, as cronie's ``load_entry``/``load_env``:

- blank lines and lines whose first non-blank character is ``#`` are not entries; the run of
  comment lines right above an entry becomes its ``description``. A blank line, a bare ``#``, a
  variable line, a disabled entry or variable (``#0/15 * * * * ...``, ``#PATH=...``) and the
  ``m h dom mon dow`` template end the run: none of them, nor what is above them, is about the
  entry below;
- ``NAME=VALUE`` (spaces around ``=`` allowed, a value in matching quotes unquoted) sets a
  variable for the lines below it. ``CRON_TZ`` (else ``TZ``) is the zone of the entries below,
  overriding ``--timezone``. ``SHELL`` is the shell that runs a command needing one.
  ``MAILTO`` becomes ``owner`` unless ``--owner`` is given (output is kept per run for
  ``cronkeeper output`` rather than mailed: said in the header and the warning). cronie's ``RANDOM_DELAY`` (minutes) becomes ``jitter``. Every other variable (``PATH``,
  ``HOME``, ``TZ``, your own) is passed to the command as cron did, through ``/usr/bin/env
  NAME=VALUE ...`` in front of the argv;
- an entry is 5 time fields (or an ``@`` macro), then in a system crontab (``/etc/crontab``,
  ``/etc/cron.d/*``, or ``--system``) a user, then the command; cronie's leading ``-`` (do not
  log) is dropped. The user is kept as a comment and a warning: cronkeeper's worker runs every
  command as its own user;
- ``%``: the command ends at the first unescaped ``%``, and the rest, with each further ``%`` a
  newline, is the command's stdin; ``\\%`` is a literal ``%``. Converted exactly (``printf`` into a
  pipe, under the crontab's shell) and warned about, since an unescaped ``%`` in ``date +%F`` is
  the classic crontab mistake;
- a command that needs a shell (operators, redirections, variables, globs, quotes with
  expansions, a builtin such as ``cd``) becomes ``[SHELL, "-c", "..."]`` with a comment saying
  why; a plain one becomes its argv.

Not converted, each reported as ``FILE:LINE: reason``: ``@reboot`` (cronkeeper fires at times,
not at boot), a line that is neither an entry, a variable nor a comment, a time field cronkeeper's
grammar refuses (the reason names the field), cronkeeper's ``H``, ``L`` and ``#`` (cron's grammar
has none: cron refused such a line and never ran it), a cron no date matches, a zone the tz database does
not know, an entry without a command, and a system-crontab entry without a user.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cronkeeper.importing import naming
from cronkeeper.importing.model import Conversion, Entry, Problem
from cronkeeper.timing import TimingError, load_zone, parse_cron, uses_hash

_ENV = re.compile(r"""(?:"([^"]*)"|'([^']*)'|([^\s='"]+))[ \t]*=[ \t]*(.*)""", re.DOTALL)
_BLANKS = re.compile(r"[ \t]+")
_SHELL_META = set("|&;<>()$`\\*?[]{}~#!\n\t")
_QUOTES = set("'\"")
_BUILTINS = {"cd", "export", "source", ".", "if", "for", "while", "until", "case", "exec", "set",
             "ulimit", "umask", "eval", "trap", "alias", "read", "unset", "time", "!", "[[", "{"}
_CRON_VARIABLES = {"MAILTO", "MAILFROM", "CRON_TZ", "SHELL", "RANDOM_DELAY", "CONTENT_TYPE",
                   "CONTENT_TRANSFER_ENCODING"}  # cron's own; not passed to the command
_MAIL_VARIABLES = {
    "MAILTO": "MAILTO: cronkeeper keeps each run's output instead of mailing it (read it with "
              "`cronkeeper output KEY`; `cronkeeper history` lists the runs); the address "
              "becomes the owner of the entries below (alerted about their dead letters and "
              "misses) unless --owner is given",
    "MAILFROM": "MAILFROM: cronkeeper sends no mail; not carried over",
    "CONTENT_TYPE": "CONTENT_TYPE: cronkeeper sends no mail; not carried over",
    "CONTENT_TRANSFER_ENCODING": "CONTENT_TRANSFER_ENCODING: cronkeeper sends no mail; not "
                                 "carried over",
}
_TEMPLATE = re.compile(r"(?i)\s*m\s+h\s+dom\s+mon\s+dow\b|\s*min(ute)?\s+hour\b")
_NAMES = "jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec|sun|mon|tue|wed|thu|fri|sat"
_CRONISH = re.compile(rf"(?i)(?:[0-9*?~LWH#/,-]|{_NAMES})+")  # what a time field is made of
_EXTENSIONS = {"H": "'H' (a value hashed from a schedule's name)", "L": "'L' (the last day or weekday of a month)",
               "#": "'#' (the n-th weekday)"}
_DIGIT_OR_STAR = re.compile(r"[0-9*?]")
_DISABLED_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=\S")
HEADER = (
    "Differences from cron, for every schedule below:",
    "- cron never retried a command: max_attempts = 1 keeps that. Raise it once the command is",
    "  safe to run twice (cronkeeper retries with backoff, then dead-letters).",
    "- cron let a run overlap the next; cronkeeper skips a period whose previous job is still",
    "  running (overlap = \"skip\", the default). Set overlap = \"allow\" to keep cron's way.",
    "- cron had no timeout; cronkeeper's worker kills a job after `timeout` (default 10m): set",
    "  it above each command's longest run.",
    "- cron mailed output to MAILTO; cronkeeper keeps each run's output (`cronkeeper output KEY`,",
    "  `cronkeeper explain KEY`) and alerts `owner` about dead letters and misses.",
    "- commands run as the worker's user, with the worker's environment plus the variables",
    "  the crontab set (passed through /usr/bin/env).",
)


@dataclass(frozen=True, slots=True)
class CronLine:
    """What cronie ran for one converted line: for --compare."""

    cron: str
    timezone: str
    line: int
    job_tz: bool  # the zone came from a CRON_TZ/TZ line (cronie's per-job zone path)


def split_percent(command: str) -> tuple[str, str | None]:
    """cronie's split of a command at its first unescaped ``%``: (command, stdin or None)."""
    out: list[str] = []
    escaped = False
    for i, ch in enumerate(command):
        if escaped:
            if ch == "%":
                out[-1] = "%"  # "\%" is a literal %
            else:
                out.append(ch)
            escaped = False
        elif ch == "\\":
            out.append(ch)
            escaped = True
        elif ch == "%":
            return "".join(out), _stdin(command[i + 1 :])
        else:
            out.append(ch)
    return "".join(out), None


def _stdin(data: str) -> str:
    """cronie's translation of the text after the first ``%``: ``%`` -> newline, ``\\%`` -> %."""
    out: list[str] = []
    escaped = False
    for ch in data:
        if escaped:
            if ch != "%":
                out.append("\\")
        elif ch == "%":
            ch = "\n"
        escaped = ch == "\\" and not escaped
        if not escaped:
            out.append(ch)
    if escaped:
        out.append("\\")
    return "".join(out)


def shell_reason(command: str) -> str | None:
    """Why ``command`` needs a shell, or None when its words are its argv."""
    meta = sorted(_SHELL_META & set(command))
    if meta:
        shown = " ".join(repr(c)[1:-1] if c not in "\n\t" else repr(c) for c in meta)
        return f"uses shell syntax ({shown})"
    words = command.split()
    if not words:
        return None
    if words[0] in _BUILTINS:
        return f"starts with the shell builtin '{words[0]}'"
    if "=" in words[0]:
        return "sets a variable for the command (NAME=value prefix)"
    if _QUOTES & set(command):
        try:
            shlex.split(command)
        except ValueError:
            return "has unbalanced quotes"
    return None


def argv(command: str) -> list[str]:
    """The argv of a command that needs no shell: its quoting removed as sh would."""
    return shlex.split(command) if _QUOTES & set(command) else command.split()


def _env_line(line: str) -> tuple[str, str] | None:
    m = _ENV.fullmatch(line)
    if m is None:
        return None
    name = m.group(1) if m.group(1) is not None else m.group(2) if m.group(2) is not None else m.group(3)
    value = m.group(4).strip(" \t")
    if len(value) >= 2 and value[0] == value[-1] and value[0] in _QUOTES:
        value = value[1:-1]
    return name, value


def _is_cron_line(text: str) -> bool:
    """A comment that holds a cron line (a disabled entry) is not a description. Its time
    fields need only look like cron's: a disabled entry may be one this grammar (or any cron)
    refuses, such as ``#0/15 * * * * root /usr/libexec/atrun``."""
    body = text.lstrip("#").strip()
    if body.startswith("@"):
        return body.split()[0] in {"@reboot", "@hourly", "@daily", "@midnight", "@weekly",
                                   "@monthly", "@yearly", "@annually"}
    fields = _BLANKS.split(body, 5)
    if len(fields) < 6:
        return False
    try:
        parse_cron(" ".join(fields[:5]))
    except TimingError:
        return all(_CRONISH.fullmatch(f) for f in fields[:5]) and any(
            _DIGIT_OR_STAR.search(f) for f in fields[:5]
        )
    return True


def _not_a_description(body: str, line: str) -> bool:
    """A comment line that ends a description rather than adding to it: a bare ``#``, a
    disabled entry or variable, the ``m h dom mon dow`` template."""
    return (not body or _is_cron_line(line) or bool(_TEMPLATE.match(body))
            or bool(_DISABLED_VARIABLE.match(body)))  # fmt: skip


def convert(
    text: str,
    *,
    source: str,
    timezone: str,
    misfire: str,
    owner: str | None,
    system: bool,
    taken: Mapping[str, str] | None = None,
) -> Conversion:
    """Convert crontab ``text`` (read from ``source``). ``timezone`` is the host's zone, the one
    cron used for lines no ``CRON_TZ``/``TZ`` governs. ``taken``: the schedule names the other
    files of the output directory define (name -> file), which the entries' names avoid
    (:func:`naming.apart`)."""
    problems: list[Problem] = []
    drafts: list[dict[str, Any]] = []
    env: dict[str, str] = {}
    comments: list[str] = []
    for number, raw in enumerate(text.split("\n"), 1):
        where = f"{source}:{number}"
        line = raw.rstrip("\r").lstrip(" \t")
        if not line.strip():
            comments = []
            continue
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            if _not_a_description(body, line):
                comments = []
            else:
                comments.append(body)
            continue
        variable = _env_line(line)
        if variable is not None:
            comments = []  # what is above a variable is not about the entry below it
            env[variable[0]] = variable[1]
            if variable[0] in _MAIL_VARIABLES:
                problems.append(Problem(where, _MAIL_VARIABLES[variable[0]], left_out=False))
            continue
        draft = _entry(line, raw.removesuffix("\r"), where, number, env, timezone, system,
                       problems)  # fmt: skip
        if draft is not None:
            draft["description"] = " ".join(comments) or None
            drafts.append(draft)
        comments = []
    named = naming.apart([d.pop("base_name") for d in drafts], stem_of(source), taken or {})
    problems.extend(Problem(d["where"], why, left_out=False)
                    for (_, why), d in zip(named, drafts, strict=True) if why)  # fmt: skip
    entries = tuple(
        _build(name, d, misfire=misfire, owner=owner)
        for (name, _), d in zip(named, drafts, strict=True)
    )
    return Conversion(
        source=source,
        header=(f"Converted by `cronkeeper import crontab` from {source}.", *HEADER),
        entries=entries,
        problems=tuple(problems),
        stem=stem_of(source),
    )


def _entry(
    line: str, raw: str, where: str, number: int, env: dict[str, str], default_zone: str,
    system: bool, problems: list[Problem],
) -> dict[str, Any] | None:
    """The draft of the entry ``line`` (``raw``: the line as the file has it, for the
    provenance comment), or None with the reason in ``problems``."""
    def leave(message: str) -> None:
        problems.append(Problem(where, message))

    if line.startswith("-"):  # cronie: do not syslog this job
        line = line[1:]
    fields_needed = 5
    if line.startswith("@"):
        macro, rest = (_BLANKS.split(line, 1) + [""])[:2]
        if macro == "@reboot":
            leave("@reboot runs once at boot, and cronkeeper fires at times: run it from a "
                  "systemd unit (WantedBy=multi-user.target) instead")  # fmt: skip
            return None
        cron = macro
    else:
        parts = _BLANKS.split(line, fields_needed)
        if len(parts) <= fields_needed:
            leave("not a crontab entry (5 time fields and a command), a variable (NAME=value) or "
                  "a comment")  # fmt: skip
            return None
        cron, rest = " ".join(parts[:fields_needed]), parts[fields_needed]
    user = None
    if system:
        user, rest = (_BLANKS.split(rest, 1) + [""])[:2]
        if not user or not rest:
            leave("a system crontab entry needs a user field before the command")
            return None
    command = rest
    if not command.strip():
        leave("no command")
        return None
    try:
        parsed = None if uses_hash(cron) else parse_cron(cron)
    except TimingError as exc:
        leave(f"cron {cron!r}: {exc}")
        return None
    used = ("H",) if parsed is None else parsed.extensions
    if parsed is None or used:
        leave(f"cron {cron!r}: {' and '.join(_EXTENSIONS[e] for e in used)} "
              f"{'is' if len(used) == 1 else 'are'} not in cron's grammar: cron refuses this "
              f"line (it never ran); cronkeeper reads {'it' if len(used) == 1 else 'them'} in "
              "schedule files only")  # fmt: skip
        return None
    if parsed.never_fires():
        leave(f"cron {cron!r} never fires: no date matches it (cron accepts it and never runs it)")
        return None
    zone = env.get("CRON_TZ") or env.get("TZ") or default_zone
    try:
        load_zone(zone)
    except TimingError as exc:
        origin = "CRON_TZ" if env.get("CRON_TZ") else "TZ" if env.get("TZ") else "--timezone"
        leave(f"{origin}={zone}: {exc}")
        return None
    for message in parsed.warnings:
        problems.append(Problem(where, f"cron {cron!r}: {message}", left_out=False))
    # The whole line, the audit trail of the conversion: it holds no newline (lines are split
    # at them), and render.comment escapes any other control character TOML refuses.
    notes: list[str] = [f"{where}: {raw}"]
    body, stdin = split_percent(command)
    shell = env.get("SHELL") or "/bin/sh"
    if stdin is not None:
        problems.append(Problem(where, (
            f"'%' in the command: cron ends the command there and feeds the rest ({len(stdin)} "
            "characters) to its stdin; converted to do the same. Write \\% for a literal %"
        ), left_out=False))  # fmt: skip
        script = 'printf \'%s\' "$0" | {\n' + body + "\n}"
        notes.append(f"cron fed the text after '%' to stdin: {shell} -c with printf | command")
        args = [shell, "-c", script, stdin]
    else:
        reason = shell_reason(body)
        if reason is None:
            args = argv(body)
        else:
            notes.append(f"needs a shell: {reason}; run as {shell} -c, as cron did")
            args = [shell, "-c", body]
    passed = {k: v for k, v in env.items() if k not in _CRON_VARIABLES}
    if passed:
        notes.append(f"environment cron gave it: {', '.join(sorted(passed))} (through env)")
        args = ["/usr/bin/env", *(f"{k}={v}" for k, v in sorted(passed.items())), *args]
    if user is not None:
        notes.append(f"cron ran this as user '{user}'; the worker runs it as its own user")
        problems.append(Problem(where, (
            f"cron ran this as user '{user}'; cronkeeper's worker runs commands as its own "
            f"user: run a worker as '{user}' for it, or make the command work as the worker's"
        ), left_out=False))  # fmt: skip
    jitter = None
    delay = env.get("RANDOM_DELAY")
    if delay and delay.isdigit() and int(delay) > 0:
        jitter = f"{int(delay)}m"
        notes.append(f"RANDOM_DELAY={delay}: jitter = \"{jitter}\"")
    return {
        "base_name": naming.command_name(body),
        "where": where,
        "cron": cron,
        "timezone": zone,
        "command": args,
        "jitter": jitter,
        "mailto": env.get("MAILTO") or None,
        "notes": notes,
        "old": CronLine(cron=cron, timezone=zone, line=number,
                        job_tz=bool(env.get("CRON_TZ") or env.get("TZ"))),
    }


def _build(name: str, d: dict[str, Any], *, misfire: str, owner: str | None) -> Entry:
    keys: list[tuple[str, Any]] = [
        ("cron", d["cron"]),
        ("timezone", d["timezone"]),
        ("misfire", misfire),
        ("command", d["command"]),
        ("max_attempts", 1),
    ]
    if d["jitter"]:
        keys.append(("jitter", d["jitter"]))
    who = owner or d["mailto"]
    if who:
        keys.append(("owner", who))
    if d["description"]:
        keys.append(("description", d["description"]))
    return Entry(name=name, where=d["where"], keys=tuple(keys), notes=tuple(d["notes"]),
                 old=d["old"])


def stem_of(source: str) -> str:
    """The output file's name without .toml: ``/etc/cron.d/php5`` -> ``php5``."""
    base = source.rsplit("/", 1)[-1]
    for ext in (".txt", ".cron", ".crontab", ".tab"):
        if base.endswith(ext) and len(base) > len(ext):
            base = base[: -len(ext)]
    return naming.slug(base) or "crontab"


def is_system_path(path: str) -> bool:
    return path == "/etc/crontab" or path.startswith("/etc/cron.d/")
