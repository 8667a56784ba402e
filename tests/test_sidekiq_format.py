"""Golden JSON for the Sidekiq job format (the Job-Format page of Sidekiq's wiki).

Sidekiq 8 cannot run here (it needs a newer Ruby than Debian 12's), so its format is checked
against its documented form: the five required fields, ``created_at``/``enqueued_at`` as integer
epoch milliseconds (Sidekiq 8.0's changelog: "now stored as epoch milliseconds, rather than
epoch floats"), and scheduled jobs in the ``schedule`` set without ``enqueued_at``. The 6/7 form
(float seconds) is also compared with what the real Sidekiq 6.4 client writes for the same job."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import UTC, datetime

import pytest
from relay_helpers import private_redis, relay_job, unique  # noqa: F401 - fixture

from cronkeeper.relay.targets import sidekiq as sidekiq_target
from cronkeeper.relay.targets.base import Delivery, sidekiq_jid

NOW = datetime(2026, 3, 8, 7, 0, 0, 123000, tzinfo=UTC)
JOB = relay_job("nightly-invoices", 0, task="InvoiceJob", payload={"region": "us", "ids": [1, 2]})
KEY = "nightly-invoices@2026-03-08T07:00:00Z"


def encode(item: dict) -> str:
    return json.dumps(item, separators=(",", ":"))


def test_sidekiq_8_golden_json_integer_milliseconds():
    item = sidekiq_target.job_hash(JOB, "billing", retry=True, timestamps="milliseconds",
                                   args=None, now=NOW, scheduled=False)
    assert encode(item) == (
        '{"class":"InvoiceJob","args":[{"region":"us","ids":[1,2]}],'
        f'"jid":"{sidekiq_jid(KEY)}","queue":"billing","retry":true,'
        '"created_at":1772953200123,"idempotency_key":"nightly-invoices@2026-03-08T07:00:00Z",'
        '"enqueued_at":1772953200123}'
    )
    # The documented minimum: class, jid (24 hex), args, created_at, enqueued_at (ms integers).
    assert re.fullmatch(r"[0-9a-f]{24}", item["jid"])
    assert isinstance(item["created_at"], int) and len(str(item["created_at"])) == 13
    assert isinstance(item["enqueued_at"], int)


def test_sidekiq_6_and_7_golden_json_float_seconds():
    item = sidekiq_target.job_hash(JOB, "billing", retry=3, timestamps="seconds",
                                   args=None, now=NOW, scheduled=False)
    assert encode(item) == (
        '{"class":"InvoiceJob","args":[{"region":"us","ids":[1,2]}],'
        f'"jid":"{sidekiq_jid(KEY)}","queue":"billing","retry":3,'
        '"created_at":1772953200.123,"idempotency_key":"nightly-invoices@2026-03-08T07:00:00Z",'
        '"enqueued_at":1772953200.123}'
    )


@pytest.mark.parametrize("timestamps", ["seconds", "milliseconds"])
def test_scheduled_jobs_carry_no_enqueued_at(timestamps):
    item = sidekiq_target.job_hash(JOB, "billing", retry=True, timestamps=timestamps,
                                   args=None, now=NOW, scheduled=True)
    assert "enqueued_at" not in item and "at" not in item


def test_a_whole_second_is_still_a_float_in_the_seconds_form():
    """Ruby reads 1772953200 as an Integer and Sidekiq 8 would take it for milliseconds."""
    assert encode({"t": sidekiq_target.stamp(datetime(2026, 3, 8, tzinfo=UTC), "seconds")}) == \
        '{"t":1772928000.0}'


def test_bad_timestamp_setting_is_refused():
    with pytest.raises(Exception, match="'timestamps' must be \"seconds\" or \"milliseconds\""):
        sidekiq_target.build("sk", {"kind": "sidekiq", "timestamps": "ms"})


def test_same_fields_and_types_as_the_real_sidekiq_6_client(private_redis):  # noqa: F811
    """Push one job with Sidekiq::Client (Ruby, Debian's ruby-sidekiq) and one with the target;
    the two JSON objects hold the same fields with the same JSON types (plus our key)."""
    if shutil.which("ruby") is None:
        pytest.fail("ruby is not installed: run scripts/test-deps.sh (ruby-sidekiq)", pytrace=False)
    queue_ruby, queue_ours = unique("ruby"), unique("ours")
    script = (
        'require "sidekiq"; '
        f'Sidekiq::Client.push("class" => "InvoiceJob", "queue" => "{queue_ruby}", '
        '"args" => [{"region" => "us", "ids" => [1, 2]}])'
    )
    done = subprocess.run(["ruby", "-e", script], env={"REDIS_URL": private_redis.url,
                          "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    target = sidekiq_target.build("sk", {"kind": "sidekiq", "redis": private_redis.url})
    target.publish(JOB, Delivery(queue=queue_ours))
    client = private_redis.client()
    theirs = json.loads(client.lindex(f"queue:{queue_ruby}", 0))
    ours = json.loads(client.lindex(f"queue:{queue_ours}", 0))
    assert client.smembers("queues") == {queue_ruby.encode(), queue_ours.encode()}

    def types(item: dict) -> dict[str, str]:
        return {k: type(v).__name__ for k, v in item.items()}

    assert types(ours) == {**types(theirs), "idempotency_key": "str"}
    assert ours["args"] == theirs["args"]
    assert abs(ours["enqueued_at"] - theirs["enqueued_at"]) < 3600  # both epoch seconds
    target.close()
