"""The loopback relay the partition tests and the soak cut connections with keeps no descriptor
of a connection that has ended: the soak's relays live through thousands of reconnects, and
before this a 30-minute soak ran out of file descriptors (EMFILE) at 1,600 s."""

from __future__ import annotations

import os
import socket
import threading

from daemon_harness import wait_for
from loopback_relay import Relay


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def echo_server() -> socket.socket:
    """A server on loopback that echoes each connection until the client closes it."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    return listener


def test_a_relay_closes_both_sockets_of_each_connection_that_ended():
    server = echo_server()
    relay = Relay(server.getsockname()[1])
    try:
        with socket.create_connection(("127.0.0.1", relay.port)) as warm:  # threads started
            warm.sendall(b"x")
            assert warm.recv(1) == b"x"
        wait_for(lambda: not relay.upstream_ports(), 10, "the warm-up connection to end")
        before = open_descriptors()
        for i in range(200):
            with socket.create_connection(("127.0.0.1", relay.port)) as client:
                client.sendall(b"ping %d" % i)
                assert client.recv(64) == b"ping %d" % i
        # 200 connections ended: 400 relay sockets (and 200 on the server's side) to close
        wait_for(lambda: not relay.upstream_ports(), 20, "every connection to end")
        wait_for(lambda: open_descriptors() <= before + 2, 20,
                 f"the relay to close what 200 ended connections used ({before} before)")
    finally:
        relay.close()
        server.close()


def test_a_cut_still_holds_back_a_close_until_healed():
    """What the partition tests rely on: while cut, a client's close reaches nobody."""
    server = echo_server()
    relay = Relay(server.getsockname()[1])
    try:
        client = socket.create_connection(("127.0.0.1", relay.port))
        client.sendall(b"a")
        assert client.recv(1) == b"a"
        relay.cut()
        client.close()
        assert len(relay.upstream_ports()) == 1  # the server's side is still open
        relay.heal()
        wait_for(lambda: relay.upstream_ports() == [], 10, "the close to pass once healed")
    finally:
        relay.close()
        server.close()
