"""A loopback TCP relay a test (or ``scripts/soak.py``) can cut and heal: what a network
partition looks like from both ends, on one machine.

``Relay(target_port)`` listens on 127.0.0.1:``port`` and forwards each connection to
127.0.0.1:``target_port``. ``cut()`` stops moving bytes both ways (and holds back every close)
without closing anything; ``heal()`` lets them flow again; ``sever()`` drops
everything a cut held back. ``upstream_ports()`` are the local
ports of its connections to the server: PostgreSQL shows them as ``client_port`` in
``pg_stat_activity``, so a test can find (and terminate) exactly the sessions of the process
behind this relay. A refused upstream (the server restarting) closes that one client and the
relay keeps accepting. Once both directions of a connection have ended, its two sockets are
closed (a relay that lives through thousands of reconnects, as the soak's do, keeps no
descriptor of a finished one).
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Relay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.flowing = threading.Event()
        self.flowing.set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = False
        self.severed = False
        self._lock = threading.Lock()
        self._upstreams: set[socket.socket] = set()
        self._sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True, name=f"relay-{self.port}").start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()  # as if the server refused: the client retries
                continue
            with self._lock:
                self._upstreams.add(upstream)
                self._sockets.update((client, upstream))
            ended: list[socket.socket] = []  # one entry per direction that has ended
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b, upstream, client, ended),
                                 daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: socket.socket,
              client: socket.socket, ended: list[socket.socket]) -> None:
        try:
            self._move(src, dst, upstream)
        finally:
            with self._lock:
                ended.append(src)
                both = len(ended) == 2
                if both:
                    self._sockets.difference_update((client, upstream))
                    self._upstreams.discard(upstream)
            if both:  # both directions over: nothing will use either socket again
                for sock in (client, upstream):
                    with contextlib.suppress(OSError):
                        sock.close()

    def _move(self, src: socket.socket, dst: socket.socket, upstream: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            self.flowing.wait()
            if self.severed:
                return
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                with self._lock:
                    self._upstreams.discard(upstream)
                return
            try:
                dst.sendall(data)
            except OSError:
                with self._lock:
                    self._upstreams.discard(upstream)
                with contextlib.suppress(OSError):  # the other direction's recv returns too
                    dst.shutdown(socket.SHUT_RDWR)
                return

    def upstream_ports(self) -> list[int]:
        ports = []
        with self._lock:
            for s in self._upstreams:
                with contextlib.suppress(OSError):
                    ports.append(s.getsockname()[1])
        return ports

    def cut(self) -> None:
        self.flowing.clear()

    def heal(self) -> None:
        self.flowing.set()

    def sever(self) -> None:
        """Drop every connection without delivering what a cut held back, and refuse new ones:
        the bytes in flight are lost, as when a link dies for good."""
        self.severed = True
        self.closed = True
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()
        self.flowing.set()

    def close(self) -> None:
        self.closed = True
        self.heal()
        self.listener.close()
