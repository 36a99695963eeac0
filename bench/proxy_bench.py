"""network = "proxy": added time per connection and throughput of one large
download through the whole path (TCP to the forwarder, its unix socket to
the daemon's ProxyServer, the policy, a fresh TCP connection upstream)
against a direct connection to the same server, in one run.

    PYTHONPATH=. /opt/leviath-dev/venv/bin/python bench/proxy_bench.py

The upstream server is on this machine's loopback, which the real proxy
refuses; the bench switches that one address check off (nothing else).
The upstream server, the proxy and the forwarder each run in a process of
their own, as in use.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

from leviathd.domain.sensitivity import Sensitivity
from leviathd.proxy import policy
from leviathd.proxy.policy import ProxySettings
from leviathd.proxy.server import Agent, ProxyServer
from leviathd.sandbox import forwarder

CONNECTIONS = 300
DOWNLOAD = 256 << 20
CHUNK = 1 << 16
ROUNDS = 5
PACE = 10e9 / 8  # bytes a second: a 10 Gbit/s link


def in_child(fn: Callable[[], None]) -> int:
    """Run `fn` in a process of its own, as the forwarder and the daemon are."""
    pid = os.fork()
    if pid == 0:
        try:
            fn()
        finally:
            os._exit(0)
    return pid


def upstream() -> tuple[int, int]:
    """A server that answers "ok" and closes, or sends DOWNLOAD bytes after "big"."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(256)
    blob = b"x" * CHUNK

    def one(c: socket.socket) -> None:
        with c:
            what = c.recv(16)
            if what.startswith(b"big"):
                for _ in range(DOWNLOAD // CHUNK):
                    c.sendall(blob)
            elif what.startswith(b"paced"):
                # As a server behind a 10 Gbit/s link would send.
                t0 = time.perf_counter()
                for i in range(DOWNLOAD // CHUNK):
                    c.sendall(blob)
                    ahead = (i + 1) * CHUNK / PACE - (time.perf_counter() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
            else:
                c.sendall(b"ok")

    def loop() -> None:
        while True:
            c, _ = srv.accept()
            threading.Thread(target=one, args=(c,), daemon=True).start()

    pid = in_child(loop)
    port = int(srv.getsockname()[1])
    srv.close()
    return pid, port


def start_proxy(path: str, port: int) -> int:
    async def main() -> None:
        policy.check_addresses = lambda *_a, **_k: None  # the upstream is on loopback
        agent = Agent(id="bench", user="bench", uid=os.getuid(), gid=os.getgid(),
                      taint=lambda: Sensitivity.PUBLIC, approvals=lambda: None,
                      is_own=lambda _cg: True)
        srv = ProxyServer(agent, ProxySettings(ports=(port,), host_ports=(port,),
                                               max_connections=512), path,
                          lambda _r: None)
        await srv.start()
        await asyncio.Event().wait()

    pid = in_child(lambda: asyncio.run(main()))
    while not os.path.exists(path):
        time.sleep(0.01)
    return pid


def start_forwarder(path: str) -> tuple[int, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    pid = in_child(lambda: forwarder.serve(sock, path))
    port = int(sock.getsockname()[1])
    sock.close()
    return pid, port


def fetch(port: int, what: bytes, via: int | None) -> int:
    s = socket.create_connection(("127.0.0.1", via or port))
    with s:
        if via is not None:
            s.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += s.recv(1024)
            assert b" 200 " in head, head
        s.sendall(what)
        n = 0
        while data := s.recv(1 << 20):
            n += len(data)
        return n


def per_connection(port: int, via: int | None) -> list[float]:
    out = []
    for _ in range(CONNECTIONS):
        t = time.perf_counter()
        assert fetch(port, b"small", via) == 2
        out.append((time.perf_counter() - t) * 1000)
    return out


def throughput(port: int, via: int | None, what: bytes = b"big") -> float:
    t = time.perf_counter()
    assert fetch(port, what, via) == DOWNLOAD
    return DOWNLOAD / (time.perf_counter() - t) / (1 << 20)


def main() -> None:
    pids = []
    try:
        up, port = upstream()
        pids.append(up)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "proxy.sock")
            pids.append(start_proxy(path, port))
            fwd, via = start_forwarder(path)
            pids.append(fwd)
            per_connection(port, via)  # warm up
            direct = per_connection(port, None)
            proxied = per_connection(port, via)
            d50, p50 = statistics.median(direct), statistics.median(proxied)
            d99 = statistics.quantiles(direct, n=100)[98]
            p99 = statistics.quantiles(proxied, n=100)[98]
            print(f"connection (open, 2 bytes, close), {CONNECTIONS} each: direct p50 "
                  f"{d50:.2f} ms p99 {d99:.2f} ms; proxied p50 {p50:.2f} ms p99 {p99:.2f} ms; "
                  f"added p50 {p50 - d50:.2f} ms")
            # Alternated, best of ROUNDS each: on a shared machine the load
            # changes between two downloads; the best is the least disturbed.
            td = tp = 0.0
            for _ in range(ROUNDS):
                td = max(td, throughput(port, None))
                tp = max(tp, throughput(port, via))
            print(f"download {DOWNLOAD >> 20} MiB: direct {td:.0f} MiB/s, proxied {tp:.0f} "
                  f"MiB/s ({100 * tp / td:.0f}% of direct)")
            td = tp = 0.0
            for _ in range(ROUNDS):
                td = max(td, throughput(port, None, b"paced"))
                tp = max(tp, throughput(port, via, b"paced"))
            print(f"download {DOWNLOAD >> 20} MiB from a server paced at 10 Gbit/s: direct "
                  f"{td:.0f} MiB/s, proxied {tp:.0f} MiB/s ({100 * tp / td:.0f}% of direct)")
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
