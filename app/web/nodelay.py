"""TCP_NODELAY on the dashboard's connections.

Streamlit 1.67 binds its listening socket as `socket.socket(family)`, whose protocol number is 0, and asyncio turns
Nagle's algorithm off only for sockets whose protocol is IPPROTO_TCP (asyncio.base_events._set_nodelay). So on a
kept-alive connection the last piece of each answer waited for the client's delayed ACK: about 40 ms per request,
measured on the MLflow endpoint's log-batch (a script logging through the MLflow client reuses its connection) and
even on /_stcore/health (44 ms on a reused connection, 3 ms on a new one). `install()` makes asyncio set
TCP_NODELAY on every TCP stream socket of this process, whatever protocol number it was made with, as it means to.
app/server.py installs it before Streamlit accepts a connection."""

from __future__ import annotations

import asyncio.base_events
import socket

_INET = (socket.AF_INET, socket.AF_INET6)


def set_nodelay(sock: socket.socket) -> None:
    """asyncio's _set_nodelay, for TCP stream sockets made without naming their protocol too."""
    if sock.family in _INET and sock.type == socket.SOCK_STREAM and sock.proto in (0, socket.IPPROTO_TCP):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def install() -> None:
    if hasattr(asyncio.base_events, "_set_nodelay"):  # a later Python without it: nothing to fix here
        asyncio.base_events._set_nodelay = set_nodelay
