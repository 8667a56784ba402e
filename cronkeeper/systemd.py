"""sd_notify, written directly to $NOTIFY_SOCKET (a datagram; no library needed)."""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send e.g. ``READY=1``, ``WATCHDOG=1``, ``STOPPING=1``; False when not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError:
        return False
    return True


def watchdog_interval() -> float | None:
    """Half of WATCHDOG_USEC, in seconds, when systemd expects pings from this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2_000_000
    except ValueError:
        return None
