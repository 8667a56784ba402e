"""Schedule names from commands and beat entry names: valid under SPEC §2's rule, unique, stable."""

from __future__ import annotations

import posixpath
import re
import shlex

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
_CONDITIONS = {"[", "[[", "test", "if", "then", "else", "fi", "!"}
_EXTENSIONS = (".sh", ".bash", ".py", ".pl", ".php", ".rb", ".js", ".mjs")


def slug(text: str) -> str:
    """Lowercase, runs of other characters as '-', trimmed; '' when nothing is left."""
    s = _INVALID.sub("-", text.lower()).strip("-._")
    return s[:NAME_MAX].rstrip("-._")


def _words(command: str) -> list[str]:
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
        base = name or "job"
        candidate, n = base, 1
        while candidate in taken:
            n += 1
            suffix = f"-{n}"
            candidate = base[: NAME_MAX - len(suffix)] + suffix
        taken.add(candidate)
        out.append(candidate)
    return out
