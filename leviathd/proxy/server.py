"""One agent's proxy, in the daemon's event loop.

It listens on `proxy.sock` in the agent's own runtime folder; the forwarder
in the agent's network namespace (leviathd/sandbox/forwarder.py) relays every
TCP connection made to 127.0.0.1:3128 there. The first byte tells the
protocol: 0x05 is SOCKS5 (CONNECT only, no authentication), anything else an
HTTP/1.x request: CONNECT host:port for a tunnel, or a plain-http request in
absolute form (`GET http://host/path`), sent on as one request with
`Connection: close`.

For each connection: the peer must be a process of this agent's scope; the
policy decides (leviathd/proxy/policy.py) against the live taint of the
agent's ledger, and may hold it for a person through the broker's approval
queue; the name is resolved here, on the host, every answer is checked, and
the connection goes to a checked address (a name whose answer changes
between check and connect cannot reach a refused address). One audit record
per connection (decision, then bytes each way) goes through leviathd/audit/trail.py.

Memory is bounded: at most `max_connections` at once per agent (and the
daemon's descriptor budget over all agents), a request head of at most
MAX_HEAD bytes, and relays in the kernel (proxy/splice.py) that hold at
most splice.PIPE_BYTES a direction before the other side has taken them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
import stat
import struct
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leviathd import fdshare, fsat, metrics, parseshare
from leviathd.broker.core import AuditRecord
from leviathd.broker.limits import descriptor_budget
from leviathd.broker.server import identify
from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import AccessDenied, LimitExceeded
from leviathd.http import message, target, write
from leviathd.http.grammar import BadMessage
from leviathd.policy.approvals import Answer, ApprovalQueue
from leviathd.proxy import inject, peer, policy, resolve, splice, tls
from leviathd.proxy.policy import Decision, ProxySettings

if TYPE_CHECKING:
    # cryptography costs the daemon memory at start: loaded with the first
    # injected credential (tests/unit/test_daemon_imports.py).
    from leviathd.proxy.ca import AgentCA

MAX_HEAD = 16384
HANDSHAKE_TIMEOUT = 30.0
CONNECT_TIMEOUT = 15.0
TOOL = "network"

_open_total = 0
# Per uid: one user's agents (or a few users' together) may not hold the whole
# budget, or every other user's proxied agents get 429 for as long as they
# keep them open.
_open_by_uid: Counter[int] = Counter()


# Descriptors a relayed connection holds: the agent's socket, the upstream,
# and a pipe (two ends) for each direction of the splice.
FDS_PER_CONNECTION = 6
# One user's agents together hold at most this fraction of the proxy's
# connections: it takes this many users at their full share to fill it.
USER_SHARES = 8


def total_budget() -> int:
    """Proxied connections over all agents: a quarter of the daemon's soft
    file limit in descriptors (the broker's connections take half; the rest
    is the daemon's own)."""
    return max(USER_SHARES, descriptor_budget() // 2 // FDS_PER_CONNECTION)


def user_budget() -> int:
    """One user's agents together: an eighth of the total, so neither one
    user nor two or three together can shut the others out."""
    return max(1, total_budget() // USER_SHARES)


class Refused(Exception):
    """The connection is not made; the message goes to the audit record."""

    def __init__(self, rule: str, reason: str, *, status: int = 403, socks: int = 2) -> None:
        super().__init__(reason)
        self.rule = rule
        self.status = status
        self.socks = socks


@dataclass
class _Conn:
    host: str = "-"
    port: int = 0
    sent: int = 0
    received: int = 0
    taint: Sensitivity = Sensitivity.PUBLIC
    decision: Decision | None = None


@dataclass(frozen=True)
class Agent:
    """What the proxy needs to know of its agent, from the gate."""

    id: str
    user: str
    uid: int
    gid: int
    taint: Callable[[], Sensitivity]
    approvals: Callable[[], ApprovalQueue | None]
    is_own: Callable[[str], bool]  # a peer's cgroup path belongs to this agent


@dataclass
class Injector:
    """The agent's credentials injected at the egress (issue 30): its CA,
    what each credential covers, and how the proxy reads a secret (the
    broker's reader, as the credential's owner) and asks about a push."""

    ca: AgentCA
    injections: tuple[inject.Injection, ...]
    secret: tls.ReadSecret
    push: str = "ask"  # the git_push permission: allow, ask or deny
    upstream: Any = None  # ssl.SSLContext toward the real hosts; None: the system's
    local: tls.LocalAnswer | None = None  # requests the daemon answers (proxy/azure.py)

    def covering(self, host: str, port: int) -> list[inject.Injection]:
        # An IP literal gets no leaf (a name constraint speaks of names): a tunnel.
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(host)
            return []
        if not self.ca.covers(host):
            return []
        return inject.covering(self.injections, host, port)


class ProxyServer:
    def __init__(self, agent: Agent, settings: ProxySettings, path: str,
                 audit: Callable[[AuditRecord], None],
                 injector: Injector | None = None) -> None:
        self.agent = agent
        self.injector = injector
        self.settings = settings
        self.path = path
        self._audit = audit
        self._listener: socket.socket | None = None
        self._acceptor: asyncio.Task[None] | None = None
        self._tcp_listener: socket.socket | None = None
        self._tcp_acceptor: asyncio.Task[None] | None = None
        # network = true (issue 30): a port on the host's loopback for the
        # covered hosts only, each peer identified by the kernel (peer.py).
        self._host_listener: socket.socket | None = None
        self._host_acceptor: asyncio.Task[None] | None = None
        self.host_port: int | None = None
        self._open = 0
        self._waiting = 0  # unix connections whose first byte has not come
        self._slot_free = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        folder, name = os.path.split(self.path)
        dfd = fsat.open_dir(folder)
        try:
            owner = os.geteuid() == 0
            sock = fsat.bind_unix_at(dfd, name, mode=0o600,
                                     uid=self.agent.uid if owner else None,
                                     gid=self.agent.gid if owner else None)
        finally:
            os.close(dfd)
        try:
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._listener = sock
        self._acceptor = asyncio.create_task(self._accept())

    async def _accept(self) -> None:
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        while True:
            # At the cap of waiting handshakes, accept nothing more until one
            # is done: the rest wait in the kernel's backlog (a flooding
            # agent's connect then fails with EAGAIN) at no cost to the loop.
            while self._waiting >= self.settings.max_connections:
                self._slot_free.clear()
                await self._slot_free.wait()
            # The loop's work for a connection (accept, identity, handshake,
            # closing what it brought, policy, lookup, audit), paced per user
            # (parseshare) before it is accepted: past the share the agent's
            # connections wait in the kernel's backlog, costing the loop
            # nothing; accepted and refused at once, a flood of them kept
            # the loop busy (bench/neighbour_bench.py, "fds").
            await parseshare.CONNECTS.pace(self.agent.uid, 1)
            try:
                conn, _ = await loop.sock_accept(self._listener)
            except OSError:
                await asyncio.sleep(0.1)  # EMFILE and such: the budget is the real bound
                continue
            task = asyncio.create_task(self._serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def adopt(self, listener: socket.socket) -> None:
        """Accept the agent's connections on its own listening socket, in
        its network namespace (forwarder.take_listener): no relay process
        between. Only this agent's processes share that namespace, so what
        connects there is the agent."""
        if self._tcp_listener is not None:
            listener.close()
            return
        listener.setblocking(False)
        self._tcp_listener = listener
        self._tcp_acceptor = asyncio.create_task(
            self._accept_loop(listener, self._serve_tcp, paced_uid=self.agent.uid))

    def listen_host(self) -> int:
        """For an agent with `network = true` (it shares the host's network
        namespace, so no listener of its own is private to it): a port on
        the host's loopback, 127.0.0.1 only, the kernel picking the number.
        Anyone on the host can connect to it; each peer is identified by the
        kernel (_serve_host) before a byte is read, and what is served there
        is only the covered hosts' injection. Returns the port."""
        if self._host_listener is not None:
            assert self.host_port is not None
            return self.host_port
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(("127.0.0.1", 0))
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._host_listener = sock
        self.host_port = int(sock.getsockname()[1])
        self._host_acceptor = asyncio.create_task(self._accept_loop(sock, self._serve_host))
        return self.host_port

    async def _accept_loop(self, listener: socket.socket,
                           serve: Callable[[socket.socket], Coroutine[Any, Any, None]],
                           *, paced_uid: int | None = None) -> None:
        """Accepts for ever, each connection served in a task of its own. With
        `paced_uid`, each accept is paced as that user's first (as in _accept):
        extra connections wait in the kernel's backlog, at no cost to the loop."""
        loop = asyncio.get_running_loop()
        while True:
            if paced_uid is not None:
                await parseshare.CONNECTS.pace(paced_uid, 1)
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError:
                await asyncio.sleep(0.1)  # EMFILE and such: the budget is the real bound
                continue
            task = asyncio.create_task(serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve_host(self, conn: socket.socket) -> None:
        """A connection to the host port: the kernel names the connecting
        socket's owner and cgroup (proxy/peer.py); only a socket of the
        agent's user made inside the agent's scope is served. Whoever
        connects is charged for it (descriptor and pace) as the uid the
        kernel named: another user flooding the agent's port spends their
        own share, not the agent's."""
        try:
            found = peer.lookup(conn)
        except OSError:
            found = None
        if found is None or not fdshare.LEDGER.take(found.uid):
            conn.close()
            return
        try:
            await parseshare.CONNECTS.pace(found.uid, 1)
            path = (peer.cgroup_path(found.cgroup_id) if found.uid == self.agent.uid
                    else None)
            own = path is not None and self.agent.is_own(path)
        except BaseException:
            conn.close()
            raise
        finally:
            fdshare.LEDGER.give(found.uid)
        if not own:
            conn.close()  # another user's process, or this user's outside the agent
            return
        conn.setblocking(False)
        await self._serve_stream(b"", conn, covered_only=True)

    async def _serve_tcp(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        await self._serve_stream(b"", conn)

    async def close(self) -> None:
        for acceptor in (self._acceptor, self._tcp_acceptor, self._host_acceptor):
            if acceptor is not None:
                acceptor.cancel()
        self._acceptor = self._tcp_acceptor = self._host_acceptor = None
        loop = asyncio.get_running_loop()
        for listener in (self._listener, self._tcp_listener, self._host_listener):
            if listener is not None:
                # The acceptor's wait in sock_accept is cancelled, but asyncio
                # drops its registration only a loop turn later: closed first,
                # the loop's map kept this number, and the next descriptor
                # opened under it (a pidfd watching an agent's PID 1) was
                # never put in epoll, its readiness never heard
                # (tests/unit/test_proxy_close.py). Removing the reader here
                # also cancels that late removal, which would otherwise take
                # the new descriptor's registration with it.
                with contextlib.suppress(ValueError, OSError):
                    loop.remove_reader(listener.fileno())
                listener.close()
        self._listener = self._tcp_listener = self._host_listener = None
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(OSError):
            dfd = fsat.open_dir(os.path.dirname(self.path))
            try:
                fsat.unlink_at(dfd, os.path.basename(self.path))
            finally:
                os.close(dfd)

    # -- one connection -------------------------------------------------------

    async def _serve(self, unix: socket.socket) -> None:
        """A connection from the forwarder: it hands over the agent's TCP
        connection itself (a descriptor, with one byte), so the relay below
        reads and writes the agent's socket with no process in between. A
        forwarder from before that change sends the agent's bytes instead;
        then the unix connection is the agent's stream.

        Until that byte came, the connection is one descriptor charged to
        the agent's user (fdshare) and one of at most max_connections
        waiting per agent: an agent that opens connections and sends
        nothing is refused at once past that, not held for 30 s each."""
        uid = self.agent.uid
        if self._waiting >= self.settings.max_connections or not fdshare.LEDGER.take(uid):
            unix.close()
            return
        self._waiting += 1
        try:
            unix.setblocking(False)
            peer = identify(unix)
            if not self.agent.is_own(peer.cgroup) or peer.uid != self.agent.uid:
                raise AccessDenied("not this agent")
            first, stream = await asyncio.wait_for(_handed(unix), HANDSHAKE_TIMEOUT)
        except (AccessDenied, OSError, TimeoutError, ValueError):
            unix.close()
            return
        except BaseException:
            unix.close()
            raise
        finally:
            self._waiting -= 1
            self._slot_free.set()
            fdshare.LEDGER.give(uid)
        if stream is not unix:
            unix.close()
        await self._serve_stream(first, stream)

    async def _serve_stream(self, first: bytes, stream: socket.socket, *,
                            covered_only: bool = False) -> None:
        """The agent's connection (`first`: a byte of it already read;
        `covered_only`: from the host's loopback port, where only covered
        hosts are served); paced when it was accepted (_serve_host: once the
        kernel named whose it is)."""
        global _open_total
        try:
            reader, writer = await asyncio.open_connection(sock=stream, limit=MAX_HEAD)
        except OSError:
            stream.close()
            return
        uid = self.agent.uid
        if (self._open >= self.settings.max_connections or _open_total >= total_budget()
                or _open_by_uid[uid] >= user_budget()
                or not fdshare.LEDGER.take(uid, FDS_PER_CONNECTION)):
            metrics.PROXY_CONNECTIONS.inc("refused")
            metrics.refused("proxy")
            self._record(_Conn(), "deny", "max_connections",
                         f"{self._open} connections open (limit max_connections = "
                         f"{self.settings.max_connections}; this user's agents "
                         f"{_open_by_uid[uid]} of {user_budget()}; descriptors held for "
                         f"this user {fdshare.LEDGER.held(uid)} of {fdshare.user_share()})")
            await _http_error(writer, 429, "too many connections")
            writer.close()
            return
        self._open += 1
        _open_total += 1
        _open_by_uid[uid] += 1
        conn = _Conn()
        try:
            await self._handle(reader, writer, conn, first, covered_only=covered_only)
        except asyncio.CancelledError:
            pass
        finally:
            self._open -= 1
            _open_total -= 1
            _open_by_uid[uid] -= 1
            if _open_by_uid[uid] <= 0:
                del _open_by_uid[uid]
            fdshare.LEDGER.give(uid, FDS_PER_CONNECTION)
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      conn: _Conn, first: bytes, *, covered_only: bool = False) -> None:
        socks = False
        try:
            if not first:
                first = await asyncio.wait_for(reader.readexactly(1), HANDSHAKE_TIMEOUT)
            socks = first == b"\x05"
            if socks:
                conn.host, conn.port = await asyncio.wait_for(_socks_head(reader, writer),
                                                              HANDSHAKE_TIMEOUT)
                head = b""
            else:
                conn.host, conn.port, head = await asyncio.wait_for(
                    _http_head(first, reader, conn), HANDSHAKE_TIMEOUT)
            if covered_only:
                self._only_covered(conn, head)
            up = await self._connect(conn)
        except Refused as exc:
            metrics.PROXY_CONNECTIONS.inc("refused")
            metrics.refused("proxy")
            self._record(conn, "deny", exc.rule, str(exc))
            if socks:
                await _socks_reply(writer, exc.socks)
            else:
                await _http_error(writer, exc.status, str(exc))
            return
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError,
                asyncio.LimitOverrunError, ValueError):
            return  # the agent went away or spoke nonsense; nothing was connected
        covered = (self.injector.covering(conn.host, conn.port)
                   if self.injector is not None and not head else [])
        try:
            if socks:
                await _socks_reply(writer, 0)
            elif not head:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            if covered:
                await self._intercept(reader, writer, up, conn, covered)
                return
            await self._relay(reader, writer, up, head, conn)
        except (ConnectionError, OSError):
            pass
        finally:
            up.close()
            metrics.PROXY_CONNECTIONS.inc("allowed")
            metrics.PROXY_BYTES.inc("sent", by=conn.sent)
            metrics.PROXY_BYTES.inc("received", by=conn.received)
            d = conn.decision
            self._record(conn, "allow", d.rule if d else "allowed",
                         f"sent {conn.sent} bytes, received {conn.received} bytes")

    def _only_covered(self, conn: _Conn, head: bytes) -> None:
        """The host's loopback port (network = true) is no general proxy:
        a tunnel to a covered host, which is then intercepted, and nothing
        else (the agent reaches every other host directly)."""
        host = policy.normalize_host(conn.host) or ""
        if head or self.injector is None or not self.injector.covering(host, conn.port):
            raise Refused("not-covered", f"this port serves only the hosts of the agent's "
                          f"injected credentials, not {conn.host[:100]!a}:{conn.port}")

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     up: socket.socket, head: bytes, conn: _Conn) -> None:
        """The rest of the connection, in the kernel (proxy/splice.py): the
        stream stops reading, what it had already read goes first, then the
        agent's socket (a second descriptor on it) and the upstream are
        spliced both ways."""
        loop = asyncio.get_running_loop()
        transport = writer.transport
        assert isinstance(transport, asyncio.ReadTransport)
        transport.pause_reading()
        buffered: bytearray = getattr(reader, "_buffer", bytearray())
        early = head + bytes(buffered)
        buffered.clear()
        if early:
            await loop.sock_sendall(up, early)
            conn.sent += len(early)
        agent = writer.get_extra_info("socket")
        own = socket.socket(fileno=os.dup(agent.fileno()))
        # The stream's own descriptor goes (the connection lives on in `own`):
        # a relay holds six descriptors, not seven.
        writer.transport.abort()
        counts = [0, 0]
        try:
            await splice.relay(own, up, counts)
        finally:
            conn.sent += counts[0]
            conn.received += counts[1]
            own.close()

    async def _intercept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         up: socket.socket, conn: _Conn,
                         covered: list[inject.Injection]) -> None:
        """A covered host: TLS ended here, the secret put in (proxy/tls.py);
        one audit record per request, with the refs of a push."""
        injector = self.injector
        assert injector is not None
        out = tls.Outcome()

        async def ask_push(repo: str, refs: list[str]) -> bool:
            if injector.push == "allow":
                return True
            if injector.push == "deny":
                return False
            approvals = self.agent.approvals()
            if approvals is None:
                return False
            try:
                answer = await approvals.ask(
                    kind="permission", tool="git_push", target=repo[:300],
                    taint=conn.taint, clearance=None, rule="git-push-at-the-proxy",
                    # Whole: every ref update and push option the server is
                    # asked for (bounded by proxy/receivepack.py's counts), never
                    # cut (issue 44: an update placed last was approved unseen).
                    detail="; ".join(refs))
            except LimitExceeded:
                return False
            return answer is not Answer.DENY

        # The agent's socket leaves the plain stream (nothing is buffered:
        # a client sends its TLS hello only after the 200) for the TLS one.
        transport = writer.transport
        assert isinstance(transport, asyncio.ReadTransport)
        transport.pause_reading()
        if getattr(reader, "_buffer", b""):
            return
        agent = socket.socket(fileno=os.dup(writer.get_extra_info("socket").fileno()))
        agent.setblocking(False)
        writer.transport.abort()
        try:
            out = await tls.intercept(
                agent, up, host=conn.host, port=conn.port, ca=injector.ca,
                injections=covered, secret=injector.secret, ask_push=ask_push,
                upstream=injector.upstream or tls.client_context(), local=injector.local)
        except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError) as exc:
            out.refused = out.refused or f"the intercepted connection failed: {exc}"
        conn.sent += out.sent
        conn.received += out.received
        refs = ", ".join(out.refs)
        if len(refs) > 2000:  # the audit's copy only; the person saw them all
            refs = refs[:2000] + f" ... ({len(out.refs)} lines in all, cut here)"
        what = f"{out.method} {out.path}" + (f" refs {refs}" if out.refs else "")
        for name in out.used:
            metrics.INJECTED.inc(name)  # the credential's name, never its value
        if out.used:
            self._record(conn, "allow", "credential " + ",".join(out.used),
                         f"{what}; {'answered by leviathd' if out.answered else 'injected'}; "
                         f"sent {out.sent} bytes, received "
                         f"{out.received} bytes")
        else:
            self._record(conn, "deny" if out.refused else "allow", "credential-not-injected",
                         f"{what}; {out.refused or 'no credential applied'}")

    async def _connect(self, conn: _Conn) -> socket.socket:
        host = policy.normalize_host(conn.host)
        if host is None or not 0 < conn.port < 65536:
            # The agent chose this text: only a bounded, escaped form is recorded.
            conn.host = ascii(conn.host[:100])
            raise Refused("bad-target", "not a host name or address and port", status=400,
                          socks=4)
        conn.host = host
        conn.taint = self.agent.taint()
        decision = policy.decide(self.settings, host, conn.port, conn.taint)
        if decision.outcome == "ask":
            decision = await self._ask(conn, decision)
        conn.decision = decision
        if decision.outcome != "allow":
            raise Refused(decision.rule, decision.reason)
        loop = asyncio.get_running_loop()
        local = policy.host_loopback(host)
        if local is not None:
            # decide() let it through: a port in [proxy] host_ports, by a name
            # that means the host itself, never by what a resolver answered.
            addrs = [local]
        else:
            try:
                # Its own threads, a few per agent and per user (proxy/resolve.py):
                # one agent's unresolvable names never hold up another's lookups.
                addrs = await resolve.shared().resolve(host, conn.port, uid=self.agent.uid,
                                                       agent=self.agent.id)
            except resolve.ResolveError as exc:
                raise Refused("resolve", f"cannot resolve {host}: {exc}", status=502,
                              socks=4) from None
            why = policy.check_addresses(addrs, allow_private=self.settings.allow_private,
                                         private_ranges=self.settings.private_ranges)
            if why is not None:
                raise Refused("address", f"refusing {host}: {why}")
        if not addrs:
            raise Refused("resolve", f"{host} resolved to nothing", status=502, socks=4)
        last: Exception | None = None
        for ip in addrs:
            family = socket.AF_INET6 if ":" in ip else socket.AF_INET
            up = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            up.setblocking(False)
            try:
                # The checked address itself, never the name again.
                await asyncio.wait_for(loop.sock_connect(up, (ip, conn.port)), CONNECT_TIMEOUT)
                return up
            except (OSError, TimeoutError) as exc:
                up.close()
                last = exc
            except BaseException:
                up.close()
                raise
        raise Refused("connect", f"cannot connect to {host}:{conn.port}: {last}", status=502,
                      socks=5)

    async def _ask(self, conn: _Conn, decision: Decision) -> Decision:
        approvals = self.agent.approvals()
        target = f"{conn.host}:{conn.port}"
        if approvals is None:
            return Decision("deny", decision.rule, decision.reason + " (no one to ask)",
                            decision.clearance)
        if approvals.session.taint_approved(TOOL, target, conn.taint):
            return Decision("allow", "approved-for-session", decision.reason,
                            decision.clearance)
        try:
            answer = await approvals.ask(kind="taint", tool=TOOL, target=target,
                                         taint=conn.taint, clearance=decision.clearance,
                                         rule=decision.rule)
        except LimitExceeded as exc:
            return Decision("deny", "max_pending_approvals", str(exc), decision.clearance)
        if answer is Answer.DENY:
            return Decision("deny", "refused-by-person-or-timeout", decision.reason,
                            decision.clearance)
        return Decision("allow", f"approved-{answer.value}", decision.reason, decision.clearance)

    def _record(self, conn: _Conn, outcome: str, rule: str, detail: str) -> None:
        clearance = conn.decision.clearance if conn.decision else None
        self._audit(AuditRecord(
            agent=self.agent.id, user=self.agent.user, uid=self.agent.uid, tool=TOOL,
            target=f"{conn.host}:{conn.port}"[:300], taint=str(conn.taint),
            clearance=str(clearance) if clearance is not None else "-", rule=rule,
            outcome=outcome, detail=detail[:500], at=time.time(),
        ))


# -- the protocols ------------------------------------------------------------


async def _handed(unix: socket.socket) -> tuple[bytes, socket.socket]:
    """What the forwarder sent first: NUL with the agent's TCP connection
    (returned as the stream, checked to be a TCP socket: the daemon only
    reads and writes it), or one byte of the agent's own (the unix
    connection is then the stream). Every other descriptor that came along,
    and the one itself when it is not a TCP socket, is closed here at once:
    the agent chose what to send (a file, a pipe, 253 at a time), and the
    daemon holds none of it."""
    loop = asyncio.get_running_loop()
    room = socket.CMSG_SPACE(fdshare.SCM_MAX_FD * 4)
    while True:
        try:
            data, ancillary, _flags, _addr = unix.recvmsg(1, room)
            break
        except BlockingIOError:
            ready = loop.create_future()
            loop.add_reader(unix.fileno(), ready.set_result, None)
            try:
                await ready
            finally:
                loop.remove_reader(unix.fileno())
    fd = _first_right(ancillary)
    if fd is None:
        fdshare.close_rights(ancillary)
        if not data:
            raise ValueError("nothing was sent")
        return data, unix
    fdshare.close_rights(ancillary, keep=fd)
    try:
        if data != b"\0" or not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise ValueError("not a socket")
        tcp = socket.socket(fileno=fd)
    except (OSError, ValueError):
        os.close(fd)
        raise ValueError("not a TCP connection") from None
    if tcp.family not in (socket.AF_INET, socket.AF_INET6) or tcp.type != socket.SOCK_STREAM:
        tcp.close()
        raise ValueError("not a TCP connection")
    tcp.setblocking(False)
    return b"", tcp


def _first_right(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS and len(data) >= 4:
            return int(struct.unpack_from("i", data)[0])
    return None


async def _socks_head(reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> tuple[str, int]:
    n = (await reader.readexactly(1))[0]
    methods = await reader.readexactly(n)
    if 0 not in methods:
        writer.write(b"\x05\xff")
        await writer.drain()
        raise ValueError("no acceptable SOCKS method")
    writer.write(b"\x05\x00")
    await writer.drain()
    ver, cmd, _rsv, atyp = await reader.readexactly(4)
    if ver != 5:
        raise ValueError("not SOCKS5")
    if atyp == 1:
        host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
    elif atyp == 4:
        host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
    elif atyp == 3:
        length = (await reader.readexactly(1))[0]
        host = (await reader.readexactly(length)).decode("ascii", "replace")
    else:
        raise Refused("bad-target", "unknown SOCKS address type", socks=8)
    port = struct.unpack("!H", await reader.readexactly(2))[0]
    if cmd != 1:
        raise Refused("socks-command", "only SOCKS5 CONNECT is supported", socks=7)
    return host, port


async def _socks_reply(writer: asyncio.StreamWriter, code: int) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        writer.write(bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0]))
        await writer.drain()


_HOP = ("proxy-connection", "proxy-authorization", "connection", "keep-alive")


async def _http_head(first: bytes, reader: asyncio.StreamReader, conn: _Conn
                     ) -> tuple[str, int, bytes]:
    """(host, port, request head to send upstream; empty for CONNECT). The
    head is parsed and written anew by the one HTTP layer (leviathd/http/);
    a refused one names its target in `conn`, bounded and escaped, for the
    audit record."""
    raw = first + await reader.readuntil(b"\r\n\r\n")
    if len(raw) > MAX_HEAD:
        raise Refused("bad-request", "request head too large", status=431)
    try:
        req, _conn = message.parse_request(raw, need_host=False)
        if req.method == "CONNECT":
            host, port = _split_host_port(req.target, 443)
            return host, port, b""
        if not req.target.lower().startswith("http://"):
            raise Refused("bad-request", "only http:// URLs and CONNECT are proxied", status=400)
        authority, _, path = req.target[7:].partition("/")
        authority = authority.rpartition("@")[2]
        host, port = _split_host_port(authority, 80)
        kept = [(k, v) for k, v in req.headers if k.lower() not in _HOP]
        head = write.request(req.method, target.origin_form("/" + path),
                             [*kept, ("Connection", "close")])
    except BadMessage as exc:
        words = raw.split(b" ", 2)
        conn.host = ascii(words[1][:100].decode("latin-1")) if len(words) > 1 else ""
        raise Refused("bad-request", f"not an HTTP/1.x proxy request: {exc}",
                      status=exc.status) from None
    return host, port, head


def _split_host_port(authority: str, default: int) -> tuple[str, int]:
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif authority.count(":") == 1:
        host, _, port_text = authority.partition(":")
    else:
        host, port_text = authority, ""
    try:
        port = int(port_text) if port_text else default
    except ValueError:
        raise Refused("bad-target", f"bad port in {authority[:100]!r}", status=400) from None
    return host, port


async def _http_error(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    body = f"leviathd proxy: {message}\n".encode("utf-8", "replace")[:1000]
    with contextlib.suppress(ConnectionError, OSError):
        writer.write(write.answer(status, "Refused", "text/plain", body))
        await writer.drain()
        writer.close()
