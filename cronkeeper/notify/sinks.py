"""Sending one message to one sink: Slack (incoming webhook), a webhook (JSON POST, signed), an
e-mail (SMTP: STARTTLS when the server offers it, or SMTPS), Apprise (an optional extra).

``send`` returns when the sink took the message and raises ``SendError`` when it did not,
saying whether trying again can help (``permanent``): a timeout, a refused connection, an HTTP
408, 425, 429 or 5xx, an SMTP 4xx are worth retrying; any other HTTP 4xx (a wrong URL, a revoked
Slack hook), an SMTP 5xx (no such mailbox), a missing recipient or secret, a certificate that
does not verify are not: they need someone to fix the config, and are counted and logged at
once (docs/notifications.md, "When a notification cannot be sent").

Only the standard library for the three kinds of our own (urllib, smtplib, ssl); Apprise is
imported when an ``apprise`` sink sends.
"""

from __future__ import annotations

import http.client
import inspect
import json
import smtplib
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from cronkeeper import __version__
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
        post(_secret(sink, "url_env", environ), body, {}, sink.timeout)
    elif sink.kind is SinkKind.WEBHOOK:
        url = sink.get("url") or _secret(sink, "url_env", environ)
        body = webhook_body(message)
        headers = {"X-Cronkeeper-Event": message.event,
                   "X-Cronkeeper-Notification": str(message.id)}
        if sink.get("secret_env"):
            headers[SIGNATURE_HEADER] = signature(body, _secret(sink, "secret_env", environ))
        post(url, body, headers, sink.timeout)
    elif sink.kind is SinkKind.EMAIL:
        send_mail(sink, message, environ)
    else:
        send_apprise(sink, message, environ)


def _secret(sink: Sink, key: str, environ: Mapping[str, str]) -> str:
    name = sink.get(key)
    value = environ.get(name) if name else None
    if not value:
        raise SendError(f"environment variable {name} ({key}) is not set in this process",
                        permanent=True)
    return value


def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> None:
    """POST ``body`` as JSON; a 2xx answer is success."""
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json; charset=utf-8", "User-Agent": USER_AGENT, **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - http(s) only
            response.read(4096)
    except urllib.error.HTTPError as exc:
        detail = _answer(exc)
        retry = exc.code >= 500 or exc.code in RETRY_STATUSES
        raise SendError(f"HTTP {exc.code} from {_where(url)}{detail}", permanent=not retry) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SendError(f"{_where(url)}: {reason}") from None
    except http.client.HTTPException as exc:  # not HTTP (a wrong port), or an answer cut short
        raise SendError(f"{_where(url)}: not an HTTP answer: {type(exc).__name__}: "
                        f"{str(exc)[:200]}") from None


def get(url: str, timeout: float, headers: dict[str, str] | None = None) -> None:
    """GET ``url`` (the heartbeat ping); a 2xx answer is success, anything else SendError."""
    request = urllib.request.Request(url, method="GET", headers={"User-Agent": USER_AGENT,
                                                                 **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - http(s) only
            response.read(4096)
    except urllib.error.HTTPError as exc:
        raise SendError(f"HTTP {exc.code} from {_where(url)}{_answer(exc)}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise SendError(f"{_where(url)}: {getattr(exc, 'reason', exc)}") from None
    except http.client.HTTPException as exc:
        raise SendError(f"{_where(url)}: not an HTTP answer: {type(exc).__name__}: "
                        f"{str(exc)[:200]}") from None


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
    try:
        if secure:
            client: smtplib.SMTP = smtplib.SMTP_SSL(url.hostname or "", port, timeout=sink.timeout,
                                                    context=context)
        else:
            client = smtplib.SMTP(url.hostname or "", port, timeout=sink.timeout)
        with client:
            client.ehlo()
            if not secure and client.has_extn("starttls"):
                client.starttls(context=context)
                client.ehlo()
                secure = True
            if user is not None:
                if not secure:
                    raise SendError(f"{where} offers no STARTTLS: refusing to send the password "
                                    "in the clear (use smtps://, or a server that offers it)",
                                    permanent=True)
                client.login(user, password or "")
            client.send_message(mail, from_addr=sink.get("from"), to_addrs=to)
    except SendError:
        raise
    except smtplib.SMTPRecipientsRefused as exc:
        codes = [code for code, _ in exc.recipients.values()]
        raise SendError(f"{where} refused the recipients: {_smtp_codes(exc.recipients)}",
                        permanent=all(code >= 500 for code in codes)) from None
    except smtplib.SMTPResponseException as exc:
        said = exc.smtp_error.decode("utf-8", "replace") if isinstance(exc.smtp_error, bytes) \
            else str(exc.smtp_error)
        raise SendError(f"{where}: {exc.smtp_code} {said}",
                        permanent=exc.smtp_code >= 500) from None
    except ssl.SSLCertVerificationError as exc:
        raise SendError(f"{where}: the server's certificate does not verify ({exc.verify_message};"
                        " ca_file names a CA to trust)", permanent=True) from None
    except (TimeoutError, smtplib.SMTPException, OSError) as exc:
        raise SendError(f"{where}: {type(exc).__name__}: {exc}") from None


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
