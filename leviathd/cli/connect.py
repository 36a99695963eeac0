"""`lev connect HOST PORT`: inside a `network = "proxy"` agent, a TCP
connection through the daemon's proxy on standard input and output. It is
the ProxyCommand git's ssh uses there (core.sshCommand, set by the daemon),
so `git clone git@host:...` goes through the same policy as everything else.
Bytes are relayed raw, by descriptor (not through lev's escaping output)."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import threading

from leviathd.errors import InvalidArgument, Unavailable
from leviathd.http import message
from leviathd.http.grammar import BadMessage

PROXY = ("127.0.0.1", 3128)
MAX_HEAD = 16384


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("connect", help="a TCP connection through the agent's network proxy "
                                       "on stdin/stdout (ssh's ProxyCommand)")
    p.add_argument("host", help="host name or address")
    p.add_argument("port", type=int, help="TCP port")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    host = str(args.host)
    if not host or len(host) > 253 or any(c.isspace() or c in "\0/@" for c in host):
        raise InvalidArgument(f"not a host name: {host[:100]!r}")
    if not 0 < args.port < 65536:
        raise InvalidArgument(f"not a port: {args.port}")
    try:
        sock = socket.create_connection(PROXY, timeout=30)
    except OSError as exc:
        raise Unavailable(f"no network proxy at {PROXY[0]}:{PROXY[1]} (is this agent's "
                          f'network "proxy"?): {exc.strerror}') from None
    authority = f"[{host}]:{args.port}" if ":" in host else f"{host}:{args.port}"
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk or len(head) > MAX_HEAD:
            raise Unavailable("the proxy closed the connection")
        head += chunk
    end = head.find(b"\r\n\r\n") + 4
    rest = head[end:]
    try:
        answer, _ = message.parse_response(head[:end], "CONNECT")
    except BadMessage as exc:
        raise Unavailable(f"the proxy's answer is not HTTP: {exc}") from None
    if answer.status != 200:
        body = rest.decode("utf-8", "replace").strip()[:300]
        raise Unavailable(f"refused by the proxy: {body or f'{answer.status} {answer.reason}'}")
    sock.settimeout(None)
    if rest:
        os.write(1, rest)
    up = threading.Thread(target=_stdin_to, args=(sock,), daemon=True)
    up.start()
    while data := sock.recv(65536):
        view = memoryview(data)
        while view:
            view = view[os.write(1, view):]
    return 0


def _stdin_to(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := os.read(0, 65536):
            sock.sendall(data)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
