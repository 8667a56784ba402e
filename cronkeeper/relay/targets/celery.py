"""The Celery target: ``send_task`` through the team's own app (``app = "module:attr"``) or a
``broker`` URL, so the team's unchanged Celery workers run the jobs (docs/celery.md).

- task name = the job's task, kwargs = the payload, task id = the idempotency key verbatim
  (:func:`celery_task_id`), headers ``idempotency_key``, ``cronkeeper_schedule`` and
  ``cronkeeper_scheduled_for``; queue from the route, else the app's default.
- On AMQP (RabbitMQ) publisher confirms are on (py-amqp waits for each ``basic.ack``; a
  ``basic.nack`` raises) and messages are ``mandatory``: RabbitMQ answers an unroutable message
  with ``basic.return`` *and then* ``basic.ack``, so confirms alone would call it delivered. A
  return handler on our own producer records it while the confirm is awaited, and the publish
  fails. A confirm timeout is ambiguous (the broker may hold the message): the connection is
  dropped (a late ack must not be read as the next message's) and the job retried with the same
  task id.
- Redis broker: the write itself is the acknowledgement; no confirms, no ``mandatory``.
- ``status``: ``AsyncResult`` when the app has a result backend, else ``UNKNOWN`` (and
  ``reports_completion`` is False, so the relay does not poll).

The queue library is imported when a target is built, never at module import (``check`` runs in
``cronkeeper validate``).
"""

from __future__ import annotations

import contextlib
import importlib
import socket
import threading
from collections.abc import Mapping
from typing import Any

from cronkeeper.relay.lanes import given_up
from cronkeeper.relay.targets.base import (
    Completion,
    Delivery,
    PermanentPublishError,
    PublishError,
    RelayJob,
    TargetUnavailable,
    celery_task_id,
)
from cronkeeper.timing.durations import parse_duration
from cronkeeper.timing.errors import TimingError

KEYS = ("kind", "broker", "app", "backend", "confirm_timeout", "connect_timeout")


def check(settings: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Problems with a ``kind = "celery"`` target's settings, as (key, message)."""
    import difflib

    found = []
    for key in settings:
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(KEYS)})"
            found.append((key, f"unknown key '{key}'{hint}"))
    has_broker, has_app = "broker" in settings, "app" in settings
    if has_broker == has_app:
        found.append(("kind", "give exactly one of 'broker' (a URL) or 'app' (\"module:attr\", "
                      "the team's Celery app)"))
    if has_app:
        app = settings["app"]
        if not isinstance(app, str) or app.count(":") != 1 or not all(app.split(":")):
            found.append(("app", "app: expected \"package.module:attribute\""))
        if "backend" in settings:
            found.append(("backend", "backend: the app's own result backend is used with 'app'"))
    if has_broker and not (isinstance(settings["broker"], str) and "://" in settings["broker"]):
        found.append(("broker", "broker: expected a URL such as amqp://user:pass@host:5672// "
                      "or redis://host:6379/0"))
    elif has_broker and (unknown := _unknown_transports(settings["broker"])):
        found.append(("broker", f"broker: no such Celery transport {', '.join(unknown)} "
                      "(amqp://, redis://, sqs://... as in Celery's broker_url)"))
    if "backend" in settings and not isinstance(settings["backend"], str):
        found.append(("backend", "backend: expected a URL such as redis://host:6379/1"))
    for key in ("confirm_timeout", "connect_timeout"):
        if key in settings:
            try:
                if parse_duration(settings[key]) <= 0:
                    found.append((key, f"{key}: must be more than 0s"))
            except TimingError as exc:
                found.append((key, f"{key}: {exc}"))
    return found


def build(name: str, settings: Mapping[str, Any]) -> CeleryTarget:
    problems = check(settings)
    if problems:
        raise PermanentPublishError(f"target {name}: " + "; ".join(m for _, m in problems))
    try:
        import celery
    except ImportError as exc:
        raise PermanentPublishError(
            f"target {name}: Celery is not installed (pip install 'cronkeeper[celery]')"
        ) from exc
    if "app" in settings:
        module_name, attr = settings["app"].split(":")
        try:
            app = getattr(importlib.import_module(module_name), attr)
        except Exception as exc:  # noqa: BLE001 - any import failure is the operator's to fix
            raise PermanentPublishError(
                f"target {name}: cannot load app {settings['app']!r}: {type(exc).__name__}: {exc}"
            ) from exc
    else:
        app = celery.Celery(f"cronkeeper-relay-{name}", broker=settings["broker"],
                            backend=settings.get("backend"), set_as_current=False)
    try:  # builds kombu's connection object, no I/O: an unknown transport fails here, not
        # at each publish (where it dead-lettered every job, with no word in the log)
        app.connection_for_write().release()
    except Exception as exc:  # noqa: BLE001 - kombu raises KeyError, ImportError...
        raise PermanentPublishError(
            f"target {name}: unusable broker URL: {_describe(exc)}") from exc
    return CeleryTarget(
        name, app,
        confirm_timeout=parse_duration(settings.get("confirm_timeout", "10s")),
        connect_timeout=parse_duration(settings.get("connect_timeout", "5s")),
    )


class CeleryTarget:
    def __init__(self, name: str, app: Any, *, confirm_timeout: float = 10.0,
                 connect_timeout: float = 5.0) -> None:
        from celery.backends.base import DisabledBackend

        self.name = name
        self.app = app
        self.confirm_timeout = confirm_timeout
        self.connect_timeout = connect_timeout
        self.reports_completion = not isinstance(app.backend, DisabledBackend)
        self._connection: Any = None
        self._producer: Any = None
        self._amqp = False
        self._returned: dict[str, str] = {}
        self._lock = threading.Lock()

    # -- connection ---------------------------------------------------------------------------

    def _open(self) -> Any:
        if self._producer is not None:
            return self._producer
        from kombu import Producer

        # read/write_timeout (py-amqp socket options; other transports ignore them): every wait
        # on the broker is bounded, not only the confirm (a queue.declare would wait forever on
        # a broker that stopped answering).
        wait = self.confirm_timeout + self.connect_timeout
        conn = self.app.connection_for_write(
            transport_options={"confirm_publish": True, "read_timeout": wait,
                               "write_timeout": wait},
            connect_timeout=self.connect_timeout,
        )
        try:
            conn.ensure_connection(max_retries=1, timeout=self.connect_timeout)
        except Exception as exc:  # noqa: BLE001 - kombu raises several kinds here
            _close(conn)
            raise TargetUnavailable(f"{self.name}: broker unreachable: {_describe(exc)}") from exc
        self._amqp = conn.transport.driver_type == "amqp"
        self._connection = conn
        # basic.return exists on AMQP only (kombu's virtual transports have no channel events)
        on_return = self._on_return if self._amqp else None
        self._producer = Producer(conn.default_channel, on_return=on_return)
        return self._producer

    def _drop(self) -> None:
        """Abandon the connection after a failure, without talking to the broker: a graceful
        close waits for the broker's Close-Ok, forever when the broker stopped answering (found
        by test_confirm_timeout_is_ambiguous_and_retried_with_the_same_task_id)."""
        conn, self._connection, self._producer = self._connection, None, None
        if conn is None:
            return
        with contextlib.suppress(Exception):
            raw = conn.connection  # py-amqp's Connection (kombu's virtual transports: no collect)
            if hasattr(raw, "collect"):
                raw.collect()  # closes the socket, no handshake
        with contextlib.suppress(Exception):
            conn.collect(socket_timeout=0.1)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        """basic.return for a mandatory message nobody could route: remember it by task id."""
        task_id = (getattr(message, "headers", None) or {}).get("id") or \
            (getattr(message, "properties", None) or {}).get("correlation_id")
        if task_id:
            self._returned[task_id] = (f"unroutable: exchange={exchange!r} "
                                       f"routing_key={routing_key!r}: {exc}")

    # -- the seam -----------------------------------------------------------------------------

    def publish(self, job: RelayJob, delivery: Delivery) -> str:
        task_id = celery_task_id(job.key)
        options = dict(delivery.options)
        headers = {
            "idempotency_key": job.key,
            "cronkeeper_schedule": job.schedule,
            "cronkeeper_scheduled_for": (
                job.scheduled_for.strftime("%Y-%m-%dT%H:%M:%SZ") if job.scheduled_for else None
            ),
        }
        with self._lock:
            producer = self._open()
            if given_up():  # the connection took past the relay's deadline: it handed the job
                # back, so sending it now would only make a second copy
                raise TargetUnavailable(f"{self.name}: connected after the relay's deadline; "
                                        "nothing sent")
            extra = {"mandatory": True, "confirm_timeout": self.confirm_timeout} if self._amqp else {}
            self._returned.pop(task_id, None)
            try:
                self.app.send_task(
                    job.task, kwargs=job.payload, task_id=task_id, headers=headers,
                    queue=delivery.queue, producer=producer, retry=False, **extra, **options,
                )
            except Exception as exc:  # noqa: BLE001 - classified below, never swallowed
                self._drop()
                raise _classify(self.name, exc) from exc
            returned = self._returned.pop(task_id, None)
        if returned is not None:
            raise PublishError(f"{self.name}: {returned}")
        return task_id

    def status(self, target_id: str) -> Completion:
        if not self.reports_completion:
            return Completion.UNKNOWN
        try:
            state = self.app.AsyncResult(target_id).state
        except Exception:  # noqa: BLE001 - the result backend is down: ask again later
            return Completion.UNKNOWN
        if state == "SUCCESS":
            return Completion.SUCCEEDED
        if state in ("FAILURE", "REVOKED"):
            return Completion.FAILED
        return Completion.PENDING  # PENDING (also: unknown id), RECEIVED, STARTED, RETRY

    def close(self) -> None:
        """A graceful close (the relay is stopping and the broker, as far as we know, answers)."""
        with self._lock:
            conn, self._connection, self._producer = self._connection, None, None
            if conn is not None:
                _close(conn)


def _classify(name: str, exc: Exception) -> PublishError:
    from amqp.exceptions import ChannelError, MessageNacked

    text = _describe(exc)
    if isinstance(exc, MessageNacked):
        return PublishError(f"{name}: the broker refused the message (basic.nack): {text}")
    if isinstance(exc, ChannelError):  # this message's fault (no such exchange...), not the broker's
        return PublishError(f"{name}: the broker refused the message: {text}")
    if _timed_out(exc):
        return PublishError(f"{name}: no publisher confirm within the timeout (or no answer "
                            f"to a queue declare; ambiguous: retried with the same task id): {text}")
    if isinstance(exc, TypeError | ValueError):
        return PublishError(f"{name}: the message could not be built: {text}")
    # The connection broke while this message was on it: ambiguous (the broker may hold it), and
    # possibly this message's doing, so it counts as this job's failed attempt.
    return PublishError(f"{name}: connection lost while publishing (ambiguous: retried with the "
                        f"same task id): {text}")


def _unknown_transports(broker: str) -> list[str]:
    """The transports of a broker URL (``;``-separated failover URLs; ``sqla+postgresql://``
    names ``sqla``) that kombu does not know; none when kombu is not installed (``build``
    then says so)."""
    try:
        from kombu.transport import TRANSPORT_ALIASES
    except ImportError:
        return []
    schemes = (url.strip().split("://", 1)[0].split("+", 1)[0] for url in broker.split(";"))
    return [repr(s) for s in schemes if s and s not in TRANSPORT_ALIASES]


def _timed_out(exc: BaseException | None) -> bool:
    """A wait that timed out, also when kombu re-raised it as OperationalError('timed out')."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, socket.timeout | TimeoutError):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _close(conn: Any) -> None:
    with contextlib.suppress(Exception):  # closing a broken connection may fail too
        conn.release()
