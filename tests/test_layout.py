"""Each line of code knows its room: pure modules import no I/O layer, and only db/ talks to
the database driver. Checked by walking imports with ast."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "cronkeeper"

PURE = ["schedule", "timing", "planning.py", "audit.py", "period_states.py", "backoff.py",
        "outage.py", "importing/crontab.py",
        "importing/cronie.py", "importing/naming.py", "importing/render.py", "importing/model.py",
        "importing/compare.py", "web/strip.py", "web/svg.py", "runtimes.py", "states.py",
        "endings.py"]
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
