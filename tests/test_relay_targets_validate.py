"""`cronkeeper validate --relay-config` checks RQ, Sidekiq and BullMQ target settings through each
target's check(): every problem at once, with file, line and a did-you-mean; no Redis needed."""

from __future__ import annotations

import subprocess

from handlers_for_tests import cronkeeper_exe

CONFIG = """\
[targets.sk]
kind = "sidekiq"
redis = "redis://127.0.0.1:6379/0"
timestamps = "ms"
retyr = 3

[targets.bq]
kind = "bullmq"
keep_completed = 5
prefix = "a:b"

[targets.rq1]
kind = "rq"
redis = "http://nope"

[targets.fine]
kind = "bullmq"
redis = "redis://127.0.0.1:6379/0"
prefix = "ck"
attempts = 3
backoff = { type = "exponential", delay = 1000 }

[[routes]]
tasks = ["A*"]
target = "sk"

[[routes]]
tasks = ["b.*"]
target = "bq"

[[routes]]
tasks = ["c.*"]
target = "rq1"

[[routes]]
tasks = ["d.*"]
target = "fine"
"""


def test_every_target_problem_with_its_line(tmp_path):
    path = tmp_path / "relay.toml"
    path.write_text(CONFIG)
    done = subprocess.run([cronkeeper_exe(), "validate", "--relay-config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    out = done.stdout + done.stderr
    assert "Traceback" not in out
    for line, message in [
        (5, "target 'sk': unknown setting 'retyr' (did you mean 'retry'?)"),
        (4, "target 'sk': 'timestamps' must be \"seconds\" or \"milliseconds\", not 'ms'"),
        (10, "target 'bq': 'prefix' must be a non-empty name without ':', not 'a:b'"),
        (9, "target 'bq': 'keep_completed' must be whole seconds >= 60"),
        (14, "target 'rq1': 'redis' must be a redis://, rediss:// or unix:// URL"),
    ]:
        assert f"{path}:{line}: {message}" in out, out
    assert "'fine'" not in out
    assert "5 errors" in out
