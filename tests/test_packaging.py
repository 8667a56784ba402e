"""The wheel carries what an installed cronkeeper needs: migrations and the alert rules."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_migrations_and_rules(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("cronkeeper-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped_sql = {f"cronkeeper/migrations/{p.name}" for p in (ROOT / "migrations").glob("*.sql")}
    assert shipped_sql and shipped_sql <= names
    assert "cronkeeper/prometheus/cronkeeper-rules.yml" in names
    assert "cronkeeper/cli/main.py" in names and "cronkeeper/timing/cron.py" in names
    assert not any(n.startswith("tests/") for n in names)
    # cronkeeper web's templates and stylesheet travel with it
    shipped_web = {f"cronkeeper/web/{p.relative_to(ROOT / 'cronkeeper' / 'web')}"
                   for p in (ROOT / "cronkeeper" / "web").rglob("*") if p.suffix in (".html", ".css")}
    assert len(shipped_web) >= 10 and shipped_web <= names
