"""Each line of code knows its room: pure modules import no I/O layer, and only db/ talks to
the database driver. Checked by walking imports with ast."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "cronkeeper"

PURE = ["schedule", "timing", "planning.py", "audit.py", "period_states.py", "backoff.py",
        "outage.py", "importing/crontab.py",
        "importing/cronie.py", "importing/naming.py", "importing/render.py", "importing/model.py",
        "importing/celery_crontab.py",
        "importing/compare.py", "web/strip.py", "web/svg.py", "runtimes.py", "states.py",
        "endings.py", "output.py", "notify/config.py", "notify/model.py", "notify/messages.py",
        "configfile.py", "audit_inputs.py", "instants.py", "summary.py"]
FORBIDDEN_IN_PURE = (
    "cronkeeper.db", "cronkeeper.cli", "cronkeeper.worker", "cronkeeper.election",
    "cronkeeper.scheduler", "cronkeeper.metrics", "sqlalchemy", "psycopg", "prometheus_client",
)
DRIVERS = ("sqlalchemy", "psycopg")
# Outside db/, only these may name a driver: each for a reason written beside it.
DRIVER_EXCEPTIONS: dict[str, str] = {}


def modules(*roots: str) -> list[Path]:
    found: list[Path] = []
    for root in roots:
        path = PACKAGE / root
        found.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else [])
    return found


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_pure_modules_import_no_io_layer():
    checked = modules(*PURE)
    assert len(checked) >= 5
    offenders = {
        str(p.relative_to(PACKAGE)): sorted(n for n in imports(p) if n.startswith(FORBIDDEN_IN_PURE))
        for p in checked
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_pure_modules_read_no_clock():
    for path in modules(*PURE):
        text = path.read_text()
        for call in ("datetime.now(", "time.time(", "time.monotonic(", "date.today("):
            assert call not in text, (path.name, call)


def test_only_db_imports_the_database_driver():
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        if rel.startswith("db/") or rel in DRIVER_EXCEPTIONS:
            continue
        bad = sorted(n for n in imports(path) if n.split(".")[0] in DRIVERS)
        if bad:
            offenders[rel] = bad
    assert offenders == {}


def test_no_runtime_module_imports_a_benchmark_peer():
    """APScheduler is a benchmark peer (the bench extra), not a runtime dependency: the package
    must run without it installed."""
    offenders = {
        str(p.relative_to(PACKAGE)): sorted(n for n in imports(p) if n.split(".")[0] == "apscheduler")
        for p in PACKAGE.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


WEB_LIBRARIES = ("flask", "werkzeug", "jinja2", "markupsafe", "waitress")


def test_only_the_web_imports_the_web_extra():
    """The daemon's install stays lean: Flask and waitress live in the optional 'web' extra,
    so nothing outside cronkeeper/web (and the command that starts it) may import them."""
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        if rel.startswith("web/") or rel == "cli/web.py":
            continue
        bad = sorted(n for n in imports(path) if n.split(".")[0] in WEB_LIBRARIES)
        if bad:
            offenders[rel] = bad
    assert offenders == {}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_worker_package_has_no_import_circle():
    """The worker's leaf modules (execute, recorder) take a ``runtime.Host``, not the loop's
    Worker: no module of the package imports one that imports it back, TYPE_CHECKING
    imports included (a circle there is still a circle to the reader)."""
    graph: dict[str, set[str]] = {}
    for path in modules("worker"):
        name = _module_name(path)
        graph[name] = {n for n in imports(path) if n.startswith("cronkeeper.worker.")}
    assert len(graph) >= 8

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                if reaches(nxt, goal, seen):
                    return True
        return False

    circles = sorted(name for name in graph if reaches(name, name, set()))
    assert circles == []


RELAY_PURE = ["relay/config.py", "relay/targets"]
QUEUE_LIBRARIES = ("celery", "kombu", "amqp", "redis", "rq", "bullmq")


def test_relay_config_and_targets_import_no_database():
    """The relay config is read and checked without a database (validate), and targets talk to
    their broker only: the relay loop (relay/loop.py) is the one that writes the outbox."""
    offenders = {
        str(p.relative_to(PACKAGE)): sorted(n for n in imports(p) if n.startswith(
            ("cronkeeper.db", "cronkeeper.cli", "cronkeeper.worker", "sqlalchemy", "psycopg")))
        for p in modules(*RELAY_PURE)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_relay_targets_import_their_queue_library_lazily():
    """`cronkeeper validate --relay-config` imports every target module (for its check()): a
    module-level import of Celery or redis would make validation slow, or fail where the extra
    is not installed."""
    for path in modules("relay/targets"):
        tree = ast.parse(path.read_text())
        top = set()
        for node in tree.body:
            if isinstance(node, ast.Import):
                top.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                top.add(node.module.split(".")[0])
        assert not top & set(QUEUE_LIBRARIES), (path.name, sorted(top & set(QUEUE_LIBRARIES)))


def test_no_import_circle_anywhere_in_the_package():
    """No module of cronkeeper imports one that imports it back (lazy imports inside functions
    included: a circle there is still a circle to the reader). ``from pkg import mod`` counts
    as importing ``pkg.mod``; packages' ``__init__`` re-exports are left out."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__init__.py":  # re-exports: importing a package is not a dependency
            continue
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)
        graph[_module_name(path)] = {d for d in deps if d.startswith("cronkeeper.")}
    graph = {name: deps & graph.keys() for name, deps in graph.items()}
    assert len(graph) >= 80

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                if reaches(nxt, goal, seen):
                    return True
        return False

    assert sorted(name for name in graph if reaches(name, name, set())) == []


def test_one_way_to_the_driver_connection():
    """Code reaches the psycopg connection under a SQLAlchemy one only through
    cronkeeper.db.engine.driver: nowhere else names ``driver_connection``."""
    offenders = sorted(
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
        if "driver_connection" in p.read_text() and p.relative_to(PACKAGE) != Path("db/engine.py")
    )
    assert offenders == []


def test_every_module_that_starts_processes_is_marked_slow():
    """The fast subset (``pytest -m "not slow"``) stays fast: a test module that starts
    daemons, workers, a browser or a private PostgreSQL is listed in conftest.SLOW_MODULES."""
    import re  # noqa: PLC0415

    from conftest import SLOW_MODULES  # noqa: PLC0415

    tests = Path(__file__).resolve().parent
    starts = re.compile(r"Daemon\(|Fleet\(|spawn_worker|spawned_workers|webdriver|"
                        r"shared_postgres|PrivatePostgres|multiprocessing|release_bin")
    unlisted = sorted(p.stem for p in tests.glob("test_*.py")
                      if p.stem not in SLOW_MODULES and p.name != Path(__file__).name
                      and starts.search(p.read_text()))
    assert unlisted == []
    assert sorted(m for m in SLOW_MODULES if not (tests / f"{m}.py").exists()) == []


def test_web_and_operations_import_nothing_from_cli():
    """cli/ and web/ render what cronkeeper/operations returns; neither layer below the CLI
    reaches up into it."""
    offenders = {
        str(p.relative_to(PACKAGE)): sorted(n for n in imports(p) if n.startswith("cronkeeper.cli"))
        for p in modules("web", "operations")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    assert len(modules("operations")) >= 7


# db/ is sorted by table: a module is named after the table its statements touch (or, split by
# concern, after the table and the concern: outbox_claims.py), or is one of these.
DB_OTHER_MODULES = {
    "__init__": "the package",
    "engine": "URLs, engines, advisory keys, driver errors",
    "migrate": "migrations (the schema_migrations table) and the upgrade policy",
    "tables": "the table definitions",
    "sessions": "the database's clock, session settings, backend pids, async sessions",
    "wake": "LISTEN/NOTIFY",
    "enqueue": "the public enqueue API (outbox rows an application writes)",
    "prune": "retention, through the prune() function",
}
# The noun a table's statements are named by (noun first: outbox_claim, periods_claim).
DB_NOUNS = {
    "outbox": ("outbox_",), "periods": ("periods_",), "attempts": ("attempts_",),
    "schedule_versions": ("versions_",), "schedule_controls": ("controls_",),
    "schedule_pauses": ("pauses_",),
    "instances": ("instances_",), "leadership": ("leadership_", "lock_"),
    "effects": ("effects_",), "relay_routes": ("relay_routes_",),
    "notifications": ("notifications_",), "notification_subjects": ("subjects_",),
    "schedule_summaries": ("summaries_",),
    "runtime_schedules": ("runtime_",), "calendars": ("calendars_",),
}
# The private fast paths of db/, each beside the reference a differential test holds it to:
# nothing outside db/ calls them (tests do, to compare them).
DB_VARIANTS = ("_periods_claim_copy", "_periods_claim_statement")


def _db_table_of(stem: str) -> str | None:
    """The table a db/ module is named after (``outbox_claims`` -> ``outbox``), or None."""
    return next((t for t in sorted(DB_NOUNS, key=len, reverse=True)
                 if stem == t or stem.startswith(t + "_")), None)


def _public_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and not n.name.startswith("_")]


def test_db_modules_are_named_by_table():
    from cronkeeper.db.tables import metadata  # noqa: PLC0415

    assert set(DB_NOUNS) | {"schema_migrations"} == set(metadata.tables)
    stems = sorted(p.stem for p in (PACKAGE / "db").glob("*.py"))
    assert [s for s in stems if s not in DB_OTHER_MODULES and _db_table_of(s) is None] == []


def test_each_db_statement_lives_with_its_table_and_is_named_noun_first():
    """A function named with a table's noun is defined only in that table's module(s), and a
    table's module defines only functions named with its noun: no outbox_ statement outside
    outbox*.py, no stray helper inside it."""
    misplaced = {}
    for path in sorted((PACKAGE / "db").glob("*.py")):
        table = _db_table_of(path.stem)
        for name in _public_functions(path):
            owner = next((t for t, nouns in DB_NOUNS.items() if name.startswith(nouns)), None)
            if owner != table and (owner is not None or table is not None):
                misplaced[f"{path.stem}.{name}"] = owner
    assert misplaced == {}


def test_each_db_statement_is_written_once():
    """No SQL text appears twice in db/ (two names for one statement): whitespace aside, every
    statement literal is unique."""
    import re  # noqa: PLC0415

    where: dict[str, list[str]] = {}
    for path in sorted((PACKAGE / "db").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = " ".join(node.value.split())
                if re.match(r"(SELECT|INSERT|UPDATE|DELETE|WITH|COPY|SET)\b", text):
                    where.setdefault(text, []).append(f"{path.stem}:{node.lineno}")
    assert len(where) >= 80
    assert {text[:60]: at for text, at in where.items() if len(at) > 1} == {}


def test_db_fast_paths_are_reached_only_through_their_public_function():
    """The COPY writer and the reference statement are db/'s own: the tick and backfill call
    periods_claim; nothing outside db/ (but the tests that compare them) names a variant, nor
    imports a private name from db/."""
    root = PACKAGE.parent
    offenders = []
    for path in [*PACKAGE.rglob("*.py"), *(root / "benchmarks").rglob("*.py"),
                 *(root / "scripts").rglob("*.py")]:
        if path.is_relative_to(PACKAGE / "db"):
            continue
        text = path.read_text()
        offenders += [f"{path.relative_to(root)}: {v}" for v in DB_VARIANTS if v in text]
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.startswith("cronkeeper.db")):
                offenders += [f"{path.relative_to(root)}: {node.module}.{a.name}"
                              for a in node.names if a.name.startswith("_")]
    assert offenders == []


# The election only elects (issue 19): what it may import of cronkeeper. Nothing that plans,
# claims or keeps schedules (planning, scheduler, leading, versions, due, schedule, the
# periods' and outbox's statements): the leader's work reaches it only as the ``lead`` callable
# it is handed, and comes back only as progress reports (cronkeeper.term).
ELECTION_MAY_IMPORT = {
    "cronkeeper.clock", "cronkeeper.errors", "cronkeeper.outage", "cronkeeper.term",
    "cronkeeper.election_signals",  # (its roles, signals and options, which others read too)
    "cronkeeper.logs",  # (say_survived: an error its housekeeping survives)
    "cronkeeper.instance",  # (the instance's row in the registry, beaten by the housekeeping)
    "cronkeeper.db.engine", "cronkeeper.db.leadership", "cronkeeper.db.sessions",
}
# The leader's side knows the election only through the Term it is handed.
LEADER_SIDE = ["term.py", "leading.py", "scheduler.py", "versions.py", "due.py"]


def _cronkeeper_imports(path: Path) -> set[str]:
    """The modules of cronkeeper a module imports (``from cronkeeper.db import leader`` is
    ``cronkeeper.db.leader``; ``from cronkeeper import __version__``, ``cronkeeper.__version__``),
    lazy imports inside functions included."""
    def submodule(package: str, name: str) -> bool:
        base = PACKAGE.parent.joinpath(*package.split("."), name)
        return base.with_suffix(".py").exists() or base.is_dir()

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                whole = submodule(node.module, a.name) or node.module == "cronkeeper"
                names.add(f"{node.module}.{a.name}" if whole else node.module)
    return {n for n in names if n.split(".")[0] == "cronkeeper"}


def test_the_election_imports_nothing_that_plans_or_claims():
    found = _cronkeeper_imports(PACKAGE / "election.py")
    assert "cronkeeper.db.leadership" in found  # the rule reads the module it means to
    assert sorted(found - ELECTION_MAY_IMPORT) == []
    leader_side = {name: _cronkeeper_imports(PACKAGE / name) for name in LEADER_SIDE}
    assert "cronkeeper.term" in leader_side["scheduler.py"]
    assert {n: "cronkeeper.election" for n, found in leader_side.items()
            if "cronkeeper.election" in found} == {}


# Size (issue 19): a module past about 400 lines, or a class past about 200, is usually two
# responsibilities. Lines as an editor counts them; a class from its ``class`` line to its last.
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 200
# Nothing goes here: split the module instead (metrics.py and audit.py were the last, split in
# issue 27's change).
OVER_SIZE_FOR_NOW: set[str] = set()


def test_no_module_or_class_is_over_its_size():
    over: dict[str, int] = {}
    checked = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        text = path.read_text()
        checked += 1
        if rel in OVER_SIZE_FOR_NOW:
            continue
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            over[rel] = lines
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    over[f"{rel}: class {node.name}"] = size
    assert checked > 100  # the rule walks the whole package
    assert over == {}
