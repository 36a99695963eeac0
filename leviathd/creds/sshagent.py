"""The per-agent SSH agent of `kind = "ssh"` credentials.

The daemon serves `ssh-agent.sock` in the agent's socket folder (the
sandbox's SSH_AUTH_SOCK), as root, to the agent's own processes only (the
broker's peer check: kernel credentials and cgroup). It offers the public
halves of the agent's ssh credentials and signs with the private halves,
which it reads when asked (as the user for a user's credential, as root for
the machine's) and never writes anywhere the agent can reach.

It signs only a user authentication for a session whose destination it
knows and a credential covers. OpenSSH (8.9 and later) tells an agent the
destination with the `session-bind@openssh.com` extension: the server's
host key, the session identifier, and the server's signature of that
identifier, which is checked here, so a bind cannot be made up for a host
the client never reached. The host key is mapped to names through
known_hosts (root's /etc/ssh/ssh_known_hosts and the user's, or the
credential's list), which the agent in a namespace sandbox cannot write.
Signing is refused when no bind came, when the last bind was for a
forwarded agent, when the data to sign is not a user authentication for
the bound session, or when no covered name has that host key. Every
signature and every refusal is an audit record.

asyncssh does the keys, the signatures and their checks and the SSH wire
encoding; this module only dispatches the agent protocol's few messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import asyncssh
from asyncssh.packet import Byte, PacketDecodeError, SSHPacket, String, UInt32
from asyncssh.public_key import decode_ssh_public_key

from leviathd import fdshare, fsat
from leviathd.broker.core import AuditRecord, Broker
from leviathd.broker.credentials import read_secret
from leviathd.broker.server import identify
from leviathd.creds.knownhosts import covered_name
from leviathd.domain.credentials import CredentialSpec
from leviathd.errors import AccessDenied, LeviathError

FAILURE, SUCCESS = 5, 6
REQUEST_IDENTITIES, IDENTITIES_ANSWER = 11, 12
SIGN_REQUEST, SIGN_RESPONSE = 13, 14
EXTENSION = 27
USERAUTH_REQUEST = 50
RSA_SHA2_256, RSA_SHA2_512 = 2, 4
SESSION_BIND = b"session-bind@openssh.com"
# OpenSSH's own bound on an agent message; ours are far smaller.
MAX_MESSAGE = 256 * 1024
MAX_BINDS = 16
MAX_CONNECTIONS = 16
MAX_KNOWN_HOSTS = 1 << 20
DEFAULT_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "~/.ssh/known_hosts")

# agent id -> its broker (None once it is gone).
BrokerOf = Callable[[], Broker | None]
Lookup = Callable[[str], str | None]


class Refused(Exception):
    """A sign request refused, with the reason for the audit record."""


@dataclass
class _Bind:
    hostkey: bytes
    session_id: bytes
    forwarding: bool


@dataclass
class _Conn:
    binds: list[_Bind] = field(default_factory=list)


# ----------------------------------------------------------------- the server


class SSHAgentServer:
    def __init__(self, agent_id: str, path: str, *, lookup: Lookup, broker_of: BrokerOf) -> None:
        self.agent_id = agent_id
        self.path = path
        self._lookup = lookup
        self._broker_of = broker_of
        self._server: asyncio.AbstractServer | None = None
        self._connections = 0
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, uid: int, gid: int) -> None:
        folder, name = os.path.split(self.path)
        dfd = fsat.open_dir(folder)
        try:
            owner = os.geteuid() == 0
            sock = fsat.bind_unix_at(dfd, name, mode=0o600, uid=uid if owner else None,
                                     gid=gid if owner else None)
        finally:
            os.close(dfd)
        try:
            # Each connection is a descriptor charged to the agent's user (fdshare).
            self._server = await asyncio.start_unix_server(fdshare.charged(uid, 1, self._serve),
                                                           sock=sock,
                                                           limit=MAX_MESSAGE + 4,
                                                           **_no_cleanup())
        except BaseException:
            sock.close()
            raise

    async def close(self) -> None:
        # Connections too: the agent (or a daemon restart) ends with them.
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None
        with contextlib.suppress(OSError):
            fsat.unlink_path(self.path)

    def _broker(self) -> Broker:
        broker = self._broker_of()
        if broker is None:
            raise AccessDenied(f"agent {self.agent_id} has no broker")
        return broker

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._connections >= MAX_CONNECTIONS:
            writer.close()
            return
        self._connections += 1
        self._writers.add(writer)
        try:
            broker = self._broker()
            peer = identify(writer.get_extra_info("socket"))
            if self._lookup(peer.cgroup) != self.agent_id or peer.uid != broker.user.uid:
                self._audit(broker, "-", "deny", "peer-identity",
                            f"pid {peer.pid} (uid {peer.uid}) is not this agent's")
                return
            conn = _Conn()
            while True:
                try:
                    head = await reader.readexactly(4)
                    (size,) = struct.unpack(">I", head)
                    if not 0 < size <= MAX_MESSAGE:
                        return
                    body = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                reply = await self._handle(conn, body)
                writer.write(struct.pack(">I", len(reply)) + reply)
                await writer.drain()
        except (AccessDenied, OSError):
            return
        except Exception as exc:  # the daemon never fails because of one client
            with contextlib.suppress(Exception):
                self._audit(self._broker(), "-", "error", "ssh-agent",
                            f"{type(exc).__name__}: {str(exc)[:200]}")
        finally:
            self._connections -= 1
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(self, conn: _Conn, body: bytes) -> bytes:
        kind, rest = body[0], body[1:]
        broker = self._broker()
        if kind == REQUEST_IDENTITIES:
            keys = await self._keys(broker)
            out = Byte(IDENTITIES_ANSWER) + UInt32(len(keys))
            for name, key in keys:
                out += String(key.public_data) + String(f"leviath:{name}")
            return out
        if kind == EXTENSION:
            return self._extension(conn, broker, rest)
        if kind == SIGN_REQUEST:
            try:
                return await self._sign(conn, broker, rest)
            except Refused as exc:
                self._audit(broker, exc.args[1] if len(exc.args) > 1 else "-", "deny",
                            "ssh-sign", str(exc.args[0])[:300])
                return Byte(FAILURE)
        # Adding, removing, locking keys: this agent's keys are the config's.
        return Byte(FAILURE)

    def _extension(self, conn: _Conn, broker: Broker, rest: bytes) -> bytes:
        try:
            packet = SSHPacket(rest)
            name = packet.get_string()
            if name != SESSION_BIND:
                return Byte(FAILURE)
            hostkey = packet.get_string()
            session_id = packet.get_string()
            signature = packet.get_string()
            forwarding = packet.get_boolean()
            packet.check_end()
            key = decode_ssh_public_key(hostkey)
            if not key.verify(session_id, signature):
                # Only a client that never reached the host sends this: say so.
                self._audit(broker, key.get_fingerprint(), "deny", "ssh-bind",
                            "a session-bind whose signature does not verify")
                return Byte(FAILURE)
        except (PacketDecodeError, asyncssh.KeyImportError, ValueError):
            return Byte(FAILURE)
        if len(conn.binds) >= MAX_BINDS:
            return Byte(FAILURE)
        conn.binds.append(_Bind(hostkey, session_id, forwarding))
        return Byte(SUCCESS)

    async def _keys(self, broker: Broker) -> list[tuple[str, asyncssh.SSHKey]]:
        out = []
        for name, spec in sorted(broker.policy.settings.credentials.items()):
            if spec.kind != "ssh":
                continue
            try:
                out.append((name, await self._private_key(broker, spec)))
            except (LeviathError, asyncssh.KeyImportError, ValueError) as exc:
                self._audit(broker, "-", "error", f"ssh:{name}",
                            f"the key does not load: {str(exc)[:200]}")
        return out

    async def _private_key(self, broker: Broker, spec: CredentialSpec) -> asyncssh.SSHKey:
        broker.start()
        assert broker._opener is not None
        text = await read_secret(spec, opener=broker._opener, uid=broker.user.uid,
                                 gid=broker.user.gid, groups=broker.user.groups,
                                 home=broker.user.home)
        return asyncssh.import_private_key(text + "\n")

    async def _sign(self, conn: _Conn, broker: Broker, rest: bytes) -> bytes:
        try:
            packet = SSHPacket(rest)
            blob = packet.get_string()
            data = packet.get_string()
            flags = packet.get_uint32()
            packet.check_end()
        except PacketDecodeError:
            raise Refused("a malformed sign request") from None
        keys = {key.public_data: (name, key) for name, key in await self._keys(broker)}
        if blob not in keys:
            raise Refused("not a key of this agent")
        name, key = keys[blob]
        if not conn.binds:
            raise Refused(f"ssh:{name}: no session-bind@openssh.com came first: the "
                          "destination is unknown (OpenSSH 8.9 or later sends it)")
        bind = conn.binds[-1]
        if any(b.forwarding for b in conn.binds):
            raise Refused(f"ssh:{name}: a forwarded agent connection (signing for hosts "
                          "beyond the first is not offered)")
        remote_user = _userauth_user(data, bind, blob)
        spec = broker.policy.settings.credentials[name]
        where = await self._covered(broker, spec, bind.hostkey)
        fp = decode_ssh_public_key(bind.hostkey).get_fingerprint()
        if where is None:
            raise Refused(f"ssh:{name}: host key {fp} is not one of a covered host "
                          f"({', '.join(spec.hosts)[:200]})", fp)
        # The gate too: [tool_permissions] ssh_sign = "ask" holds each login
        # for a person, "deny" ends them; rules see the host as the target.
        decision = await broker.decide("ssh_sign", {"host": where})
        if decision.outcome != "allow":
            raise Refused(f"ssh:{name}: refused by policy [{decision.rule}]", where)
        alg = key.algorithm
        if alg == b"ssh-rsa":
            alg = (b"rsa-sha2-512" if flags & RSA_SHA2_512 else
                   b"rsa-sha2-256" if flags & RSA_SHA2_256 else b"ssh-rsa")
        signature = key.sign(data, alg)
        self._audit(broker, where, "allow", f"ssh:{name}",
                    f"signed as {remote_user[:64]!r} with {key.get_fingerprint()}")
        return Byte(SIGN_RESPONSE) + String(signature)

    async def _covered(self, broker: Broker, spec: CredentialSpec, hostkey: bytes) -> str | None:
        for path in spec.known_hosts or DEFAULT_KNOWN_HOSTS:
            if path.startswith("~/"):
                path = os.path.join(broker.user.home, path[2:])
            # Parsed off the loop too: the text is the user's (up to 1 MiB of
            # hashed names, each tried against every pattern: a second).
            name = await asyncio.to_thread(_lookup, broker, path, hostkey, spec.hosts)
            if name is not None:
                return name
        return None

    def _audit(self, broker: Broker, target: str, outcome: str, rule: str, detail: str) -> None:
        broker.audit(AuditRecord(
            agent=self.agent_id, user=broker.user.name, uid=broker.user.uid, tool="ssh_sign",
            target=target, taint=str(broker.ledger.taint), clearance="-", rule=rule,
            outcome=outcome, detail=detail,
        ))


def _userauth_user(data: bytes, bind: _Bind, blob: bytes) -> str:
    """The remote user of a user authentication request for the bound
    session with this key; anything else is refused."""
    try:
        packet = SSHPacket(data)
        session_id = packet.get_string()
        if packet.get_byte() != USERAUTH_REQUEST:
            raise Refused("the data to sign is not a user authentication")
        user = packet.get_string()
        packet.get_string()  # service
        method = packet.get_string()
        if method not in (b"publickey", b"publickey-hostbound-v00@openssh.com"):
            raise Refused("the data to sign is not a public key authentication")
        if not packet.get_boolean():
            raise Refused("the data to sign is a query, not an authentication")
        packet.get_string()  # algorithm
        if packet.get_string() != blob:
            raise Refused("the data to sign names another key")
        if method != b"publickey" and packet.get_string() != bind.hostkey:
            raise Refused("the data to sign names another host key than the bound one")
        packet.check_end()
    except PacketDecodeError:
        raise Refused("the data to sign is not a user authentication") from None
    if not hmac.compare_digest(session_id, bind.session_id):
        raise Refused("the data to sign is for another session than the bound one")
    return user.decode("utf-8", "replace")


def _lookup(broker: Broker, path: str, hostkey: bytes, hosts: tuple[str, ...]) -> str | None:
    text = _read_as_user(broker, path)
    return covered_name(text, hostkey, hosts) if text else None


def _read_as_user(broker: Broker, path: str) -> str:
    broker.start()
    assert broker._opener is not None
    try:
        fd = broker._opener.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except (OSError, LeviathError):
        return ""
    try:
        return os.read(fd, MAX_KNOWN_HOSTS).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _no_cleanup() -> dict[str, Any]:
    import sys

    # The socket's name is a /proc/self/fd path once bound through a descriptor.
    return {"cleanup_socket": False} if sys.version_info >= (3, 13) else {}
