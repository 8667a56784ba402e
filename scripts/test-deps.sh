#!/usr/bin/env bash
# What the test suite needs from the system, installed when missing (Debian, as root) and
# started when installed but down. Idempotent: a machine that has everything is left alone.
# Each tool is here because a test drives the real thing (see README, "Testing").
set -uo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have promtool || need+=(prometheus)           # promtool check/test rules
have pgbouncer || need+=(pgbouncer)           # the daemon refuses a transaction-pooling proxy
have redis-server || need+=(redis-server)     # RQ, Sidekiq and BullMQ relay targets
have rabbitmq-server || need+=(rabbitmq-server)  # the Celery relay target on AMQP
[ -x /usr/bin/chromium ] || need+=(chromium)         # cronkeeper web in a real browser
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)  # ... driven by Selenium
have sidekiq || need+=(ruby-sidekiq)          # a real Sidekiq server (6.4) for the Sidekiq target
have node || need+=(nodejs npm)               # a real BullMQ worker for the BullMQ target
have faketime || need+=(faketime)             # libfaketime: instances (and a PostgreSQL) on a wrong clock
have openssl || need+=(openssl)               # a self-signed certificate for the SMTP tests' STARTTLS and SMTPS
if [ "${#need[@]}" -gt 0 ]; then
  echo "test-deps: installing ${need[*]}"
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# Services the tests talk to on loopback.
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "test-deps: starting redis on 127.0.0.1:6379"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
if ! (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; then
  echo "test-deps: starting rabbitmq on 127.0.0.1:5672"
  rabbitmq-server -detached || service rabbitmq-server start
  for _ in $(seq 1 60); do (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null && break; sleep 1; done
fi
# npm packages the tests run (a BullMQ worker), pinned by tests/node/package-lock.json.
repo="$(cd "$(dirname "$0")/.." && pwd)"
if [ ! -d "$repo/tests/node/node_modules" ]; then
  echo "test-deps: npm ci in tests/node"
  npm ci --prefix "$repo/tests/node" --no-audit --no-fund >/dev/null
fi

# Whatever could not be installed or started fails here, by name, rather than as a test
# failure later (a test that needs a tool fails, never skips, when it is missing).
missing=()
for tool in promtool pgbouncer redis-server rabbitmq-server sidekiq node npm faketime openssl; do
  have "$tool" || missing+=("$tool")
done
for path in /usr/bin/chromium /usr/bin/chromedriver; do  # the paths tests/test_web_browser.py drives
  [ -x "$path" ] || missing+=("$path")
done
redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || missing+=("redis on 127.0.0.1:6379")
(exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null || missing+=("rabbitmq on 127.0.0.1:5672")
[ -d "$repo/tests/node/node_modules" ] || missing+=("tests/node/node_modules (npm ci)")
if [ "${#missing[@]}" -gt 0 ]; then
  echo "test-deps: still missing: ${missing[*]}" >&2
  exit 1
fi
exit 0
