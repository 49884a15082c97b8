"""The dashboard's connections do not hold back the end of an answer (app/web/nodelay.py): a TCP socket made as
Streamlit makes its listening socket (no protocol number) gets TCP_NODELAY from asyncio once installed, as one made
with IPPROTO_TCP always did; other sockets are left alone."""

from __future__ import annotations

import asyncio.base_events
import socket

import pytest

from app.web import nodelay


def nagle_off(sock: socket.socket) -> bool:
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


def test_asyncio_sets_nodelay_on_a_tcp_socket_made_without_its_protocol_once_installed(monkeypatch) -> None:
    monkeypatch.setattr(asyncio.base_events, "_set_nodelay", asyncio.base_events._set_nodelay)  # restored after
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as plain:
        asyncio.base_events._set_nodelay(plain)
        assert plain.proto == 0 and not nagle_off(plain)  # asyncio's own rule skips it: the ~40 ms stall
        nodelay.install()
        asyncio.base_events._set_nodelay(plain)
        assert nagle_off(plain)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        asyncio.base_events._set_nodelay(udp)  # not a stream: nothing to set, nothing raised


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no unix sockets here")
def test_a_unix_socket_is_left_alone() -> None:
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        nodelay.set_nodelay(a)  # would raise if it tried TCP options on it
