"""Sending one message to one sink: Slack (incoming webhook), a webhook (JSON POST, signed), an
e-mail (SMTP: STARTTLS when the server offers it, or SMTPS), Apprise (an optional extra).

``send`` returns when the sink took the message and raises ``SendError`` when it did not,
saying whether trying again can help (``permanent``): a timeout, a refused connection, an HTTP
408, 425, 429 or 5xx, an SMTP 4xx are worth retrying; any other HTTP 4xx (a wrong URL, a revoked
Slack hook), an SMTP 5xx (no such mailbox), a missing recipient or secret, a certificate that
does not verify are not: they need someone to fix the config, and are counted and logged at
once (docs/notifications.md, "When a notification cannot be sent").

A sink's ``timeout`` bounds its whole request (for e-mail, the whole conversation), not each
read (``deadline.py``): a server that answers a byte at a time fails at it, retried.

Only the standard library for the three kinds of our own (urllib, smtplib, ssl); Apprise is
imported when an ``apprise`` sink sends (bounded only as Apprise bounds its services).
"""

from __future__ import annotations

import http.client
import inspect
import json
import smtplib
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from cronkeeper import __version__
from cronkeeper.notify.deadline import Deadline
from cronkeeper.notify.messages import (
    SIGNATURE_HEADER,
    Message,
    email_message,
    signature,
    slack_body,
    text,
    title,
    webhook_body,
)
from cronkeeper.notify.model import Sink, SinkKind, is_address

USER_AGENT = f"cronkeeper/{__version__}"
RETRY_STATUSES = frozenset({408, 425, 429})


class SendError(Exception):
    """The sink did not take the message; ``permanent``: trying again cannot help."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


def send(sink: Sink, message: Message, environ: Mapping[str, str]) -> None:
    """Deliver ``message`` to ``sink`` (secrets read from ``environ``), or raise SendError."""
    if sink.kind is SinkKind.SLACK:
        body = json.dumps(slack_body(message), ensure_ascii=False).encode()
        post(_secret(sink, "url_env", environ), body, {}, sink.timeout, name=_named(sink))
    elif sink.kind is SinkKind.WEBHOOK:
        url = sink.get("url") or _secret(sink, "url_env", environ)
        body = webhook_body(message)
        headers = {"X-Cronkeeper-Event": message.event,
                   "X-Cronkeeper-Notification": str(message.id)}
        if sink.get("secret_env"):
            headers[SIGNATURE_HEADER] = signature(body, _secret(sink, "secret_env", environ))
        post(url, body, headers, sink.timeout, name=_named(sink))
    elif sink.kind is SinkKind.EMAIL:
        send_mail(sink, message, environ)
    else:
        send_apprise(sink, message, environ)


def _named(sink: Sink) -> str:
    return f"sink '{sink.name}'"


def _secret(sink: Sink, key: str, environ: Mapping[str, str]) -> str:
    name = sink.get(key)
    value = environ.get(name) if name else None
    if not value:
        raise SendError(f"environment variable {name} ({key}) is not set in this process",
                        permanent=True)
    return value


def post(url: str, body: bytes, headers: dict[str, str], timeout: float, *,
         name: str = "sink") -> None:
    """POST ``body`` as JSON; a 2xx answer is success. ``timeout`` bounds the whole request."""
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json; charset=utf-8", "User-Agent": USER_AGENT, **headers})
    _fetch(request, timeout, name, refusals=True)


def get(url: str, timeout: float, headers: dict[str, str] | None = None, *,
        name: str = "heartbeat ping") -> None:
    """GET ``url`` (the heartbeat ping); a 2xx answer is success, anything else SendError.
    ``timeout`` bounds the whole request."""
    request = urllib.request.Request(url, method="GET", headers={"User-Agent": USER_AGENT,
                                                                 **(headers or {})})
    _fetch(request, timeout, name, refusals=False)


def _fetch(request: urllib.request.Request, timeout: float, name: str, *,
           refusals: bool) -> None:
    """Send ``request`` and read the start of its answer, all within ``timeout``
    (``deadline.py``); ``refusals``: an HTTP 4xx but 408, 425, 429 is a refusal for good."""
    url = request.full_url
    with Deadline(timeout) as deadline:
        try:
            with deadline.opener(_tls()).open(request) as response:
                response.read(4096)
            return
        except urllib.error.HTTPError as exc:
            if not deadline.expired:
                detail = _answer(exc)  # read within the deadline too
                retry = exc.code >= 500 or exc.code in RETRY_STATUSES
                raise SendError(f"HTTP {exc.code} from {_where(url)}{detail}",
                                permanent=refusals and not retry) from None
            error = ""
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLCertVerificationError) and not deadline.expired:
                raise SendError(f"{_where(url)}: the server's certificate does not verify "
                                f"({reason.verify_message}; a private CA is trusted through "
                                "SSL_CERT_FILE in the process's environment)",
                                permanent=True) from None
            error = f"{_where(url)}: {reason}"
        except http.client.HTTPException as exc:  # not HTTP (a wrong port), or cut short
            error = (f"{_where(url)}: not an HTTP answer: {type(exc).__name__}: "
                     f"{str(exc)[:200]}")
    if deadline.expired:  # whatever the cut socket raised: the time ran out
        raise SendError(deadline.passed(f"{name} ({_where(url)})"))
    raise SendError(error)


def _tls() -> ssl.SSLContext:
    """The context ``urlopen`` would use (the system's CAs, HTTP/1.1 by ALPN)."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    return context


def _where(url: str) -> str:
    """The URL's scheme, host and port, never its path (a Slack hook's path is its secret)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def _answer(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read(300).decode("utf-8", "replace").strip()
    except Exception:  # noqa: BLE001 - the status says enough
        body = ""
    return f": {body.splitlines()[0]}" if body else ""


def recipients(sink: Sink, owner: str | None) -> list[str]:
    """The sink's fixed addresses, and the owner when ``to_owner`` and it is an address."""
    found = list(sink.get("to") or [])
    if sink.get("to_owner") and is_address(owner) and owner not in found:
        found.append(owner)
    return found


def send_mail(sink: Sink, message: Message, environ: Mapping[str, str]) -> None:
    to = recipients(sink, message.owner)
    if not to:
        raise SendError(f"no recipient: the owner {message.owner!r} is not an e-mail address "
                        "and the sink lists no 'to'", permanent=True)
    url = urlsplit(sink.get("smtp"))
    secure = url.scheme == "smtps"
    port = url.port or (465 if secure else 25)
    context = ssl.create_default_context(cafile=sink.get("ca_file"))
    user = _secret(sink, "user_env", environ) if sink.get("user_env") else None
    password = _secret(sink, "password_env", environ) if sink.get("password_env") else None
    mail = email_message(message, sender=sink.get("from"), to=to, sink=sink.name)
    where = f"{url.scheme}://{url.hostname}:{port}"
    with Deadline(sink.timeout) as deadline:  # the whole conversation (deadline.py)
        try:
            client: smtplib.SMTP = (
                _SmtpSsl(deadline, url.hostname or "", port, context) if secure
                else _Smtp(deadline, url.hostname or "", port))
            with client:
                client.ehlo()
                if not secure and client.has_extn("starttls"):
                    client.starttls(context=deadline.context(context))
                    client.ehlo()
                    secure = True
                if user is not None:
                    if not secure:
                        raise SendError(f"{where} offers no STARTTLS: refusing to send the "
                                        "password in the clear (use smtps://, or a server that "
                                        "offers it)", permanent=True)
                    client.login(user, password or "")
                client.send_message(mail, from_addr=sink.get("from"), to_addrs=to)
            return
        except SendError:
            raise
        except Exception as exc:  # noqa: BLE001 - what the cut socket raised, or _mail_error's
            if not deadline.expired:
                raise _mail_error(exc, where) from None
    raise SendError(deadline.passed(f"{_named(sink)} ({where})"))


class _Smtp(smtplib.SMTP):
    """smtplib.SMTP whose socket is watched by ``deadline`` from the greeting on."""

    def __init__(self, deadline: Deadline, host: str, port: int) -> None:
        self.deadline = deadline
        super().__init__(host, port, timeout=deadline.remaining())

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        return self.deadline.connect((host, port), timeout, self.source_address)


class _SmtpSsl(smtplib.SMTP_SSL):
    """smtplib.SMTP_SSL whose TLS socket is watched from its handshake on."""

    def __init__(self, deadline: Deadline, host: str, port: int,
                 context: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=deadline.remaining(),
                         context=deadline.context(context))


def _mail_error(exc: Exception, where: str) -> Exception:
    """The SendError an SMTP failure is: a 5xx or a certificate is for good, else retried
    (anything unforeseen goes on as it is: the sender retries it)."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        codes = [code for code, _ in exc.recipients.values()]
        return SendError(f"{where} refused the recipients: {_smtp_codes(exc.recipients)}",
                         permanent=all(code >= 500 for code in codes))
    if isinstance(exc, smtplib.SMTPResponseException):
        said = exc.smtp_error.decode("utf-8", "replace") if isinstance(exc.smtp_error, bytes) \
            else str(exc.smtp_error)
        return SendError(f"{where}: {exc.smtp_code} {said}", permanent=exc.smtp_code >= 500)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return SendError(f"{where}: the server's certificate does not verify "
                         f"({exc.verify_message}; ca_file names a CA to trust)", permanent=True)
    if isinstance(exc, (TimeoutError, smtplib.SMTPException, OSError)):
        return SendError(f"{where}: {type(exc).__name__}: {exc}")
    return exc


def _smtp_codes(refused: dict) -> str:
    return "; ".join(f"{addr}: {code} {msg.decode('utf-8', 'replace') if isinstance(msg, bytes) else msg}"
                     for addr, (code, msg) in refused.items())


def send_apprise(sink: Sink, message: Message, environ: Mapping[str, str]) -> None:
    """Through Apprise (``pip install 'cronkeeper[apprise]'``): ``notify()`` answers true or
    false (Apprise 2: an ``AppriseResult`` true only on success), and says why in its log,
    which is captured into the error. Every failure is retried: Apprise does not say whether
    trying again can help."""
    try:
        import apprise  # noqa: PLC0415 - the optional extra, only when such a sink sends
    except ImportError:
        raise SendError("kind 'apprise' needs the apprise extra: pip install "
                        "'cronkeeper[apprise]'", permanent=True) from None
    url = _secret(sink, "url_env", environ)
    notifier = apprise.Apprise()
    if not notifier.add(url):
        raise SendError(f"Apprise does not understand the URL in {sink.get('url_env')}",
                        permanent=True)
    kind = {"recovered": apprise.NotifyType.SUCCESS, "dead": apprise.NotifyType.FAILURE}.get(
        message.event, apprise.NotifyType.WARNING)
    options: dict[str, Any] = {"title": title(message), "body": text(message),
                               "notify_type": kind}
    if "timeout" in inspect.signature(notifier.notify).parameters:  # Apprise 2: a call's bound
        options["timeout"] = sink.timeout
    with apprise.LogCapture(level=apprise.logging.WARNING) as said:
        ok = notifier.notify(**options)
        log_text = said.getvalue().strip() if hasattr(said, "getvalue") else ""
    if not ok:
        raise SendError("Apprise could not deliver" + (f": {log_text.splitlines()[-1]}"
                                                       if log_text else ""))
