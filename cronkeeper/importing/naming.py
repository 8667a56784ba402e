"""Schedule names from commands and beat entry names: valid under docs/schedules.md's naming rule, unique, stable."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping

NAME_MAX = 60  # well under the 128 the rule allows; long names make poor log fields
_INVALID = re.compile(r"[^a-z0-9._-]+")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_OPERATORS = {"|", "||", "&&", ";", "&", "(", ")", "{", "}"}
# Programs that run another program: the name comes from what they run.
_WRAPPERS = {"nice", "ionice", "nohup", "env", "sudo", "chronic", "cronic", "time", "exec",
             "command", "stdbuf", "taskset", "systemd-cat", "unbuffer", "run-one", "caffeinate"}
_WRAPPERS_WITH_ARG = {"flock": 1, "timeout": 1, "setlock": 1, "runuser": 0, "su": 0}
_INTERPRETERS = {"sh", "bash", "dash", "zsh", "ksh", "python", "python2", "python3", "perl",
                 "php", "ruby", "node", "nodejs", "pypy3", "uv", "poetry", "pipenv"}
# Programs whose first argument says what the job is: "manage-clearsessions", "run-parts-daily".
_DISPATCHERS = {"run-parts", "manage", "artisan", "rake", "make", "npm", "yarn", "pnpm", "docker",
                "docker-compose", "kubectl", "systemctl", "drush", "wp", "console", "celery",
                "flask", "django-admin", "bundle", "mix", "cargo", "git", "curl", "wget", "rsync"}
_CONDITIONS = {"[", "[[", "test", "if", "elif", "while", "until", "!"}
# Keywords that stand before a command ("then /usr/lib/zfs-linux/scrub"): skipped alone.
_KEYWORDS = {"then", "else", "do", "done", "fi", "esac"}
_EXTENSIONS = (".sh", ".bash", ".py", ".pl", ".php", ".rb", ".js", ".mjs")


def slug(text: str) -> str:
    """Lowercase, runs of other characters as '-', trimmed; '' when nothing is left."""
    s = _INVALID.sub("-", text.lower()).strip("-._")
    return s[:NAME_MAX].rstrip("-._")


def without_substitutions(command: str) -> str:
    """``command`` with its command substitutions (``$(...)``, ``$((...))``, backquotes) cut
    out: what they run is an argument's value, never what the job is (``[ $(date +%d) -le 7 ]
    && checkarray`` is a checkarray job, not a date job). Single quotes protect, as in sh."""
    out: list[str] = []
    i, n = 0, len(command)
    quoted = False  # inside '...'
    while i < n:
        ch = command[i]
        if quoted:
            quoted = ch != "'"
            out.append(ch)
            i += 1
        elif ch == "'":
            quoted = True
            out.append(ch)
            i += 1
        elif ch == "\\" and i + 1 < n:
            out.append(command[i : i + 2])
            i += 2
        elif ch == "$" and command.startswith("$(", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if command[i] == "\\":
                    i += 1
                elif command[i] == "(":
                    depth += 1
                elif command[i] == ")":
                    depth -= 1
                i += 1
        elif ch == "`":
            i += 1
            while i < n and command[i] != "`":
                i += 2 if command[i] == "\\" else 1
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _words(command: str) -> list[str]:
    command = without_substitutions(command)
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        return list(lexer)
    except ValueError:  # unbalanced quotes: the shell would fail too; names still help
        return command.split()


def _program(word: str) -> str:
    base = posixpath.basename(word.rstrip("/")) or word
    for ext in _EXTENSIONS:
        if base.endswith(ext) and len(base) > len(ext):
            return base[: -len(ext)]
    return base


def command_name(command: str) -> str:
    """A readable name for a shell command line: ``/usr/local/bin/backup.sh --full`` -> ``backup``,
    ``cd /srv/app && python manage.py clearsessions`` -> ``manage-clearsessions``."""
    words = _words(command)
    i = 0
    while i < len(words):
        word = words[i]
        if word in _OPERATORS or _ASSIGNMENT.match(word) or word.startswith("-") or word.isdigit():
            i += 1  # an option's value ("nice -n 10") is a number, a program name is not
            continue
        if word and set(word) <= set("<>&"):  # a redirection: its target is no name either
            i += 2
            continue
        if word in _KEYWORDS or _program(word).startswith("$"):  # a $VARIABLE is no name
            i += 1
            continue
        if word in _CONDITIONS:  # "[ -x prog ] && prog": skip the test up to the operator
            while i < len(words) and words[i] not in _OPERATORS:
                i += 1
            continue
        if word == "cd":  # "cd DIR && prog": the program is after the operator
            i += 2
            continue
        program = _program(word)
        if program in _WRAPPERS or program in _INTERPRETERS:
            i += 1
            continue
        if program in _WRAPPERS_WITH_ARG:
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 1
            i += _WRAPPERS_WITH_ARG[program]
            continue
        name = program
        if program in _DISPATCHERS:
            for arg in words[i + 1 :]:
                if arg in _OPERATORS:
                    break
                if not arg.startswith("-") and not _ASSIGNMENT.match(arg):
                    name = f"{program}-{_program(arg)}"
                    break
        found = slug(name)
        if found:
            return found
        i += 1
    return "job"


def unique(names: list[str]) -> list[str]:
    """The same names, later duplicates suffixed -2, -3 ... (in input order, so stable)."""
    taken: set[str] = set()
    out: list[str] = []
    for name in names:
        candidate = _free(name or "job", taken)
        taken.add(candidate)
        out.append(candidate)
    return out


def _free(base: str, taken: set[str]) -> str:
    """``base``, or the first of ``base-2``, ``base-3`` ... (cut to fit) not in ``taken``."""
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        suffix = f"-{n}"
        candidate = base[: NAME_MAX - len(suffix)] + suffix
    return candidate


def apart(
    names: list[str], stem: str, taken: Mapping[str, str]
) -> list[tuple[str, str | None]]:
    """``names`` made unique within one file (:func:`unique`) and across the directory it goes
    to: a name another file there defines (``taken``: name -> that file) gets this file's
    ``stem`` in front (``web02`` + ``backup`` -> ``web02-backup``), then -2, -3 ... if that is
    taken too. Returns (name, a warning saying why it is not the name ``unique`` gave, or None).
    Stable: the same names and ``taken`` give the same result."""
    own = unique(names)
    used = set(taken) | {n for n in own if n not in taken}
    out: list[tuple[str, str | None]] = []
    for name in own:
        if name not in taken:
            out.append((name, None))
            continue
        candidate = _free(name if name.startswith(f"{stem}-") else slug(f"{stem}-{name}"), used)
        used.add(candidate)
        out.append((candidate, f"schedule name '{name}' is already defined in {taken[name]}, "
                               f"and names are unique across a directory: named '{candidate}'"))
    return out
