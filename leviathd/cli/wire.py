"""A small blocking D-Bus client for `lev`'s short commands (ps, stop, logs,
run without a terminal). Importing dbus_fast pulls in asyncio and costs more
than the rest of such a command together (issue 18); this speaks the wire
protocol itself: EXTERNAL authentication, fd passing, and the types the
Manager1 API uses. The daemon keeps dbus-fast.

Every length read from the bus is checked against the message it came in,
so a malformed message raises WireError instead of reading past it."""

from __future__ import annotations

import _socket  # the socket module's C half: the Python half imports enum, selectors
import os
import select
import struct

from leviathd.bus.names import BUS_NAME, MANAGER_IFACE, OBJECT_PATH
from leviathd.errors import LeviathError

# typing imports re; mypy reads any TYPE_CHECKING as true (start-up, issue 18).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

SYSTEM_BUS = "/run/dbus/system_bus_socket"
DRIVER = "org.freedesktop.DBus"
# The spec's limits: a message is at most 128 MiB, an array 64 MiB.
MAX_MESSAGE = 128 * 1024 * 1024
MAX_FDS = 16
# Refusals that say "try again" and leave nothing started: the user's
# requests being prepared are at their bound (issue 22), or polkit did not
# answer the daemon (issue 17).
TRY_AGAIN = frozenset({"org.leviath.Error.Busy", "org.leviath.Error.AuthorizationUnavailable"})
# Signals of the daemon's kept while a call waits for its reply (AgentEnded
# of other agents of ours); the oldest go first.
MAX_KEPT_SIGNALS = 4096
# How long a start waits, in all, while the daemon says Busy (it bounds the
# requests of one user being prepared at once; issue 22). A Busy start left
# nothing behind, so waiting long costs nothing: 1,000 starts sent at once
# (250 a user) took 2-3 minutes here, as long as 1,000 `systemd-run` did
# (docs/operations.md, "How many agents a machine runs"); 120 s gave up on 426.
BUSY_PATIENCE = 600.0
# The longest pause between two asks: hundreds of waiting clients asking
# every second were a load of their own.
BUSY_BACKOFF = 2.0

METHOD_CALL, METHOD_RETURN, ERROR, SIGNAL = 1, 2, 3, 4
NO_REPLY_EXPECTED = 0x1

_FIXED = {"y": "B", "b": "I", "n": "h", "q": "H", "i": "i", "u": "I", "x": "q", "t": "Q",
          "d": "d", "h": "I"}  # fmt: skip
_ALIGN = {"y": 1, "b": 4, "n": 2, "q": 2, "i": 4, "u": 4, "x": 8, "t": 8, "d": 8, "h": 4,
          "s": 4, "o": 4, "g": 1, "a": 4, "(": 8, "{": 8, "v": 1}  # fmt: skip
# Header field codes and their types.
_FIELDS = {1: ("path", "o"), 2: ("interface", "s"), 3: ("member", "s"), 4: ("error_name", "s"),
           5: ("reply_serial", "u"), 6: ("destination", "s"), 7: ("sender", "s"),
           8: ("signature", "g"), 9: ("unix_fds", "u")}  # fmt: skip
_CODES = {name: (code, sig) for code, (name, sig) in _FIELDS.items()}

FRIENDLY = {
    "org.freedesktop.DBus.Error.ServiceUnknown": (
        "leviathd is not running (start it with `systemctl start leviathd`)"
    ),
    "org.freedesktop.DBus.Error.NameHasNoOwner": "leviathd is not running",
    "org.freedesktop.DBus.Error.AccessDenied": "the system bus refused the call",
}


# (seconds, what to do once a call has waited that long)
Slow = tuple[float, "Callable[[], None]"]


class WireError(LeviathError):
    """The bus sent something this client cannot read, or went away."""


class DaemonError(LeviathError):
    def __init__(self, name: str, text: str) -> None:
        super().__init__(text)
        self.name = name


class Variant:
    """A D-Bus variant: its signature and value (as dbus_fast.Variant names them)."""

    __slots__ = ("signature", "value")

    def __init__(self, signature: str, value: Any) -> None:
        self.signature = signature
        self.value = value

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Variant)
            and (self.signature, self.value) == (other.signature, other.value)
        )

    def __hash__(self) -> int:
        return hash(self.signature)

    def __repr__(self) -> str:
        return f"Variant({self.signature!r}, {self.value!r})"


class Message:
    """One D-Bus message (no dataclasses: their import is start-up time)."""

    def __init__(
        self, type: int, *, serial: int = 0, flags: int = 0, path: str | None = None,
        interface: str | None = None, member: str | None = None,
        error_name: str | None = None, reply_serial: int | None = None,
        destination: str | None = None, sender: str | None = None, signature: str = "",
        body: list[Any] | None = None, unix_fds: list[int] | None = None,
    ) -> None:  # fmt: skip
        self.type = type
        self.serial = serial
        self.flags = flags
        self.path = path
        self.interface = interface
        self.member = member
        self.error_name = error_name
        self.reply_serial = reply_serial
        self.destination = destination
        self.sender = sender
        self.signature = signature
        self.body: list[Any] = body if body is not None else []
        self.unix_fds: list[int] = unix_fds if unix_fds is not None else []


def _type_end(sig: str, i: int) -> int:
    """The index just past the single complete type starting at sig[i]."""
    if i >= len(sig):
        raise WireError(f"bad signature {sig!r}")
    c = sig[i]
    if c == "a":
        return _type_end(sig, i + 1)
    if c in "({":
        close = ")" if c == "(" else "}"
        j = i + 1
        while j < len(sig) and sig[j] != close:
            j = _type_end(sig, j)
        if j >= len(sig):
            raise WireError(f"bad signature {sig!r}")
        return j + 1
    if c in _ALIGN:
        return i + 1
    raise WireError(f"bad signature {sig!r}")


def split_signature(sig: str) -> list[str]:
    types, i = [], 0
    while i < len(sig):
        j = _type_end(sig, i)
        types.append(sig[i:j])
        i = j
    return types


class _Writer:
    def __init__(self) -> None:
        self.buf = bytearray()

    def align(self, n: int) -> None:
        self.buf += b"\0" * (-len(self.buf) % n)

    def put(self, t: str, v: Any) -> None:
        c = t[0]
        if c in _FIXED:
            self.align(_ALIGN[c])
            self.buf += struct.pack("<" + _FIXED[c], (1 if v else 0) if c == "b" else v)
        elif c in "so":
            data = str(v).encode()
            self.align(4)
            self.buf += struct.pack("<I", len(data)) + data + b"\0"
        elif c == "g":
            data = str(v).encode()
            self.buf += bytes([len(data)]) + data + b"\0"
        elif c == "v":
            self.put("g", v.signature)
            self.put(v.signature, v.value)
        elif c == "a":
            self.align(4)
            at = len(self.buf)
            self.buf += b"\0\0\0\0"
            elem = t[1:]
            self.align(_ALIGN[elem[0]])
            start = len(self.buf)
            if elem[0] == "{":
                kt, vt = split_signature(elem[1:-1])
                for key, val in v.items():
                    self.align(8)
                    self.put(kt, key)
                    self.put(vt, val)
            else:
                for item in v:
                    self.put(elem, item)
            struct.pack_into("<I", self.buf, at, len(self.buf) - start)
        elif c == "(":
            self.align(8)
            for sub, item in zip(split_signature(t[1:-1]), v, strict=True):
                self.put(sub, item)
        else:
            raise WireError(f"cannot write type {t!r}")


# One compiled Struct per fixed type and byte order: `lev ps` reads ~17,000
# values for 1,000 agents (issue 34).
_STRUCTS = {order: {c: struct.Struct(order + f) for c, f in _FIXED.items()} for order in "<>"}


class _Reader:
    def __init__(self, data: bytes, order: str, pos: int = 0) -> None:
        self.data = data
        self.order = order
        self.pos = pos
        self._fixed = _STRUCTS[order]
        self._u32 = self._fixed["u"]

    def _take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > len(self.data):
            raise WireError("truncated message")
        self.pos += n
        return start

    def align(self, n: int) -> None:
        self._take(-self.pos % n)

    def _length(self) -> int:
        self.align(4)
        (n,) = self._u32.unpack_from(self.data, self._take(4))
        return int(n)

    def get(self, t: str, depth: int = 0) -> Any:
        if depth > 64:
            raise WireError("message nested too deep")
        c = t[0]
        data = self.data
        fixed = self._fixed.get(c)
        if fixed is not None:
            # align() and _take() inline, the same bounds: the padding and
            # the value lie inside the message.
            at = self.pos + (-self.pos % _ALIGN[c])
            if at + fixed.size > len(data):
                raise WireError("truncated message")
            (v,) = fixed.unpack_from(data, at)
            self.pos = at + fixed.size
            return bool(v) if c == "b" else v
        if c in "so":
            at = self.pos + (-self.pos % 4)
            if at + 4 > len(data):
                raise WireError("truncated message")
            (n,) = self._u32.unpack_from(data, at)
            at += 4
            if at + n + 1 > len(data):
                raise WireError("truncated message")
            self.pos = at + n + 1
            return data[at : at + n].decode()
        if c == "g":
            n = self.data[self._take(1)]
            at = self._take(n + 1)
            return self.data[at : at + n].decode()
        if c == "v":
            sig = self.get("g")
            if not _single_type(sig):
                raise WireError("bad variant signature")
            return Variant(sig, self.get(sig, depth + 1))
        if c == "a":
            n = self._length()
            elem = t[1:]
            self.align(_ALIGN[elem[0]])
            end = self.pos + n
            if end > len(self.data):
                raise WireError("truncated array")
            if elem[0] == "{":
                kt, vt = split_signature(elem[1:-1])
                out: dict[Any, Any] = {}
                while self.pos < end:
                    self.align(8)
                    key = self.get(kt, depth + 1)
                    out[key] = self.get(vt, depth + 1)
                return out
            items = []
            while self.pos < end:
                items.append(self.get(elem, depth + 1))
            return items
        if c == "(":
            self.align(8)
            return [self.get(sub, depth + 1) for sub in split_signature(t[1:-1])]
        raise WireError(f"cannot read type {t!r}")


# Variant signatures seen and found to be one complete type; bounded, since
# a message's sender picks them (any local user can send us signals).
_SINGLE: set[str] = set()
_SINGLE_MAX = 256


def _single_type(sig: str) -> bool:
    if sig in _SINGLE:
        return True
    if len(split_signature(sig)) != 1:
        return False
    if len(_SINGLE) < _SINGLE_MAX:
        _SINGLE.add(sig)
    return True


def encode(msg: Message) -> bytes:
    body = _Writer()
    for t, v in zip(split_signature(msg.signature), msg.body, strict=True):
        body.put(t, v)
    fields: list[list[Any]] = []
    for name, (code, sig) in _CODES.items():
        value = getattr(msg, name)
        if name == "unix_fds":
            value = len(msg.unix_fds) or None
        elif name == "signature":
            value = msg.signature or None
        if value is not None:
            fields.append([code, Variant(sig, value)])
    head = _Writer()
    head.buf += struct.pack("<cBBBII", b"l", msg.type, msg.flags, 1, len(body.buf), msg.serial)
    head.put("a(yv)", fields)
    head.align(8)
    return bytes(head.buf + body.buf)


def parse(buf: bytearray, fds: list[int]) -> Message | None:
    """The first whole message in buf (taken out of it, with its descriptors
    from fds), or None while it is incomplete."""
    if len(buf) < 16:
        return None
    order = {ord("l"): "<", ord("B"): ">"}.get(buf[0])
    if order is None or buf[3] != 1:
        raise WireError("not a D-Bus message")
    body_len, serial, fields_len = struct.unpack_from(order + "III", buf, 4)
    head_len = 16 + fields_len + (-(16 + fields_len) % 8)
    total = head_len + body_len
    if total > MAX_MESSAGE:
        raise WireError("message too large")
    if len(buf) < total:
        return None
    data = bytes(buf[:total])
    del buf[:total]
    msg = Message(type=data[1], flags=data[2], serial=serial)
    n_fds = 0
    for code, value in _Reader(data[:head_len], order, 12).get("a(yv)"):
        if code not in _FIELDS:
            continue  # the spec says unknown fields are ignored
        name, sig = _FIELDS[code]
        if value.signature != sig:
            raise WireError(f"header field {code} has type {value.signature!r}")
        if name == "unix_fds":
            n_fds = int(value.value)
        else:
            setattr(msg, name, value.value)
    if n_fds > len(fds):
        raise WireError("a message names more descriptors than came with it")
    msg.unix_fds = fds[:n_fds]
    del fds[:n_fds]
    body = _Reader(data, order, head_len)
    msg.body = [body.get(t) for t in split_signature(msg.signature)]
    return msg


# `lev -H`/`-M` (cli/remote.py): the argv of a bridge to another machine's
# system bus, spoken to over its stdin and stdout; None: the local bus.
BRIDGE: list[str] | None = None
BRIDGE_TARGET = ""


def _bridged() -> _socket.socket:
    """Our end of a socket pair whose other end is the bridge's stdin and
    stdout (ssh ... systemd-stdio-bridge)."""
    import subprocess

    assert BRIDGE is not None
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        subprocess.Popen(BRIDGE, stdin=theirs.fileno(), stdout=theirs.fileno(),
                         close_fds=True)
    except OSError:
        ours.close()
        raise
    finally:
        theirs.close()
    return ours


def _bus_path() -> str:
    address = os.environ.get("DBUS_SYSTEM_BUS_ADDRESS", "")
    for part in address.split(";"):
        if part.startswith("unix:"):
            for kv in part[5:].split(","):
                if kv.startswith("path="):
                    return kv[5:]
                if kv.startswith("abstract="):
                    return "\0" + kv[9:]
    return SYSTEM_BUS


class Connection:
    """One connection to the system bus; calls wait for their reply, and
    signals that arrive meanwhile are kept, in order, for next_signal."""

    def __init__(self) -> None:
        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        self._serial = 1
        self._buf = bytearray()
        self._fds: list[int] = []
        # Signals from this sender only: any local user may unicast signals
        # to us, and they must neither pile up nor hold descriptors.
        self.keep_signals_from: str | None = None
        self.signals: list[Message] = []
        self.wakeup: int | None = None  # a fd that ends a wait in next_signal
        hello = encode(Message(
            METHOD_CALL, destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus", member="Hello", serial=1,
        ))  # fmt: skip
        try:
            if BRIDGE is None:
                self.sock.connect(_bus_path())
                self._auth(hello)
            else:
                self.sock.close()
                self.sock = _bridged()
                self._auth(hello, fds=False)
        except OSError as exc:
            self.sock.close()
            where = f" of {BRIDGE_TARGET}" if BRIDGE is not None else ""
            raise LeviathError(f"cannot reach the system bus{where}: {exc}") from None
        self.unique_name = str(self.reply_to(1).body[0])

    def _line(self) -> bytes:
        """One line of the handshake. Read as the bus sends it (the lines
        and, often, the reply to Hello in one piece), not byte by byte: a
        system call per byte was a good part of connecting (issue 18). What
        follows the line stays in the buffer for the messages."""
        while (end := self._buf.find(b"\r\n")) < 0:
            if len(self._buf) > 4096:
                raise OSError("the bus ended authentication")
            try:
                self._fill(None, wake=False)
            except WireError:
                raise OSError("the bus ended authentication") from None
        line = bytes(self._buf[: end + 2])
        del self._buf[: end + 2]
        return line

    def _auth(self, first: bytes, *, fds: bool = True) -> None:
        """The whole handshake and the first message (Hello) in one write, as
        the spec allows and sd-bus does: one round trip instead of three, a
        good part of a short command's time on a loaded bus (issue 18). An
        answer other than OK and AGREE_UNIX_FD ends the connection, whatever
        the bus made of what followed."""
        if not fds:
            # A bridge (cli/remote.py): EXTERNAL with no identity of ours, as
            # sd-bus sends it there; the far bus knows the bridge's own, and
            # no descriptors cross ssh.
            self.sock.sendall(b"\0AUTH EXTERNAL\r\nDATA\r\nBEGIN\r\n" + first)
            if not self._line().startswith(b"DATA"):
                raise OSError("the bridge did not answer (is systemd-stdio-bridge there?)")
            if not self._line().startswith(b"OK "):
                raise OSError("the bridge refused EXTERNAL authentication")
            return
        uid = str(os.geteuid()).encode().hex().encode()
        self.sock.sendall(b"\0AUTH EXTERNAL " + uid + b"\r\nNEGOTIATE_UNIX_FD\r\nBEGIN\r\n"
                          + first)
        if not self._line().startswith(b"OK "):
            raise OSError("the bus refused EXTERNAL authentication")
        if not self._line().startswith(b"AGREE_UNIX_FD"):
            raise OSError("the bus does not pass file descriptors")

    def send(self, msg: Message) -> int:
        self._serial += 1
        msg.serial = self._serial
        data = encode(msg)
        if msg.unix_fds:
            # struct, not array: importing array imports collections (~1 ms
            # of every lev's start-up here), to register it as a sequence.
            fds = struct.pack(f"{len(msg.unix_fds)}i", *msg.unix_fds)
            anc = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)]
            sent = self.sock.sendmsg([data], anc)
            self.sock.sendall(data[sent:])
        else:
            self.sock.sendall(data)
        return msg.serial

    def _fill(self, timeout: float | None, wake: bool = True) -> bool:
        """Read more from the bus; False when nothing came within timeout
        (or, with wake, the wakeup fd fired)."""
        watch: list[Any] = [self.sock]
        if wake and self.wakeup is not None:
            watch.append(self.wakeup)
        ready, _w, _x = select.select(watch, [], [], timeout)
        if self.sock not in ready:
            return False
        data, anc, _flags, _addr = self.sock.recvmsg(
            65536, _socket.CMSG_SPACE(MAX_FDS * 4), _socket.MSG_CMSG_CLOEXEC
        )
        for level, kind, payload in anc:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                count = len(payload) // 4
                self._fds += list(struct.unpack(f"{count}i", payload[: count * 4]))
        if not data:
            raise WireError("the bus closed the connection")
        self._buf += data
        return True

    def receive(self, timeout: float | None = None) -> Message | None:
        while True:
            msg = parse(self._buf, self._fds)
            if msg is not None:
                return msg
            if not self._fill(timeout):
                return None

    def _keep(self, msg: Message) -> None:
        for fd in msg.unix_fds:  # no signal of the API carries any
            os.close(fd)
        msg.unix_fds = []
        keep = self.keep_signals_from
        # The bus itself (NameOwnerChanged, after a match for it) is the other
        # sender kept: no client can take its name.
        if msg.type == SIGNAL and keep is not None and msg.sender in (keep, DRIVER):
            if len(self.signals) >= MAX_KEPT_SIGNALS:
                del self.signals[0]
            self.signals.append(msg)

    def call(self, msg: Message, on_slow: Slow | None = None) -> Message:
        """Send msg and wait for its reply; on_slow = (seconds, callback):
        the callback runs once if the reply takes longer."""
        return self.reply_to(self.send(msg), on_slow)

    def reply_to(self, serial: int, on_slow: Slow | None = None) -> Message:
        """Wait for the reply to the call sent as `serial`."""
        import time

        slow_at = None if on_slow is None else time.monotonic() + on_slow[0]
        while True:
            got = parse(self._buf, self._fds)
            if got is None:
                # A signal handler's wakeup must not end a call early.
                if slow_at is None:
                    self._fill(None, wake=False)
                elif not self._fill(max(slow_at - time.monotonic(), 0), wake=False):
                    assert on_slow is not None
                    on_slow[1]()
                    slow_at = None
            elif got.type in (METHOD_RETURN, ERROR) and got.reply_serial == serial:
                return got
            else:
                self._keep(got)

    def call_driver(self, member: str, signature: str = "", body: list[Any] | None = None,
                    ) -> Message:  # fmt: skip
        return self.call(Message(
            METHOD_CALL, destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus", member=member, signature=signature,
            body=body or [],
        ))  # fmt: skip

    def next_signal(self, timeout: float | None) -> Message | None:
        """The next signal (kept or new); None after timeout or a wakeup."""
        while not self.signals:
            msg = self.receive(timeout)
            if msg is None:
                return None
            self._keep(msg)
        return self.signals.pop(0)

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self.sock.close()


# The bus's word that the daemon's name changed hands (both clients).
RESTART_MATCH = (f"type='signal',sender='{DRIVER}',interface='{DRIVER}',"
                 f"member='NameOwnerChanged',arg0='{BUS_NAME}'")


def new_owner(
    is_signal: bool, sender: str | None, interface: str | None, member: str | None,
    body: list[Any],
) -> str | None:
    """The daemon's new unique name when a message is the bus (no client can
    send as org.freedesktop.DBus) saying the name has a new owner; else None."""
    if (is_signal and sender == DRIVER and interface == DRIVER and member == "NameOwnerChanged"
            and len(body) == 3 and body[0] == BUS_NAME and body[2]):
        return str(body[2])
    return None


class SyncClient:
    """The blocking counterpart of cli.client.Client, for the same calls."""

    def __init__(self) -> None:
        self.conn = Connection()
        self._daemon: str | None = None

    def call_with_fds(
        self, member: str, signature: str = "", body: list[Any] | None = None,
        unix_fds: list[int] | None = None, *, interface: str = MANAGER_IFACE,
        on_slow: Slow | None = None,
    ) -> tuple[list[Any], list[int]]:  # fmt: skip
        reply = self.conn.call(Message(
            METHOD_CALL, destination=BUS_NAME, path=OBJECT_PATH, interface=interface,
            member=member, signature=signature, body=body or [], unix_fds=unix_fds or [],
        ), on_slow)  # fmt: skip
        if reply.type == ERROR:
            text = str(reply.body[0]) if reply.body else ""
            name = reply.error_name or "org.leviath.Error.Failed"
            raise DaemonError(name, FRIENDLY.get(name, text or name))
        return reply.body, reply.unix_fds

    def call(
        self, member: str, signature: str = "", body: list[Any] | None = None,
        unix_fds: list[int] | None = None, *, interface: str = MANAGER_IFACE,
        on_slow: Slow | None = None,
    ) -> list[Any]:  # fmt: skip
        out, fds = self.call_with_fds(
            member, signature, body, unix_fds, interface=interface, on_slow=on_slow
        )
        for fd in fds:
            os.close(fd)
        return out

    def call_when_free(
        self, member: str, signature: str = "", body: list[Any] | None = None,
        unix_fds: list[int] | None = None, on_slow: Slow | None = None,
    ) -> list[Any]:  # fmt: skip
        """call(), asked again while the daemon answers Busy or
        AuthorizationUnavailable: many starts sent at once then queue here
        instead of failing. Backs off
        with jitter up to BUSY_BACKOFF, for BUSY_PATIENCE seconds in all."""
        import time

        deadline = time.monotonic() + BUSY_PATIENCE
        delay = 0.05
        while True:
            try:
                return self.call(member, signature, body, unix_fds, on_slow=on_slow)
            except DaemonError as exc:
                if exc.name not in TRY_AGAIN or time.monotonic() + delay > deadline:
                    raise
            import random  # only when asked again: its import is start-up time

            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, BUSY_BACKOFF)

    def daemon_name(self) -> str:
        """The daemon's unique name; signals are trusted only from it (any
        local user can unicast a signal to us with any path and body)."""
        if self._daemon is None:
            reply = self.conn.call_driver("GetNameOwner", "s", [BUS_NAME])
            if reply.type == ERROR:
                # Not running yet: activate it, as a method call would.
                self.conn.call_driver("StartServiceByName", "su", [BUS_NAME, 0])
                reply = self.conn.call_driver("GetNameOwner", "s", [BUS_NAME])
            if reply.type == ERROR:
                raise DaemonError(
                    "org.freedesktop.DBus.Error.NameHasNoOwner",
                    FRIENDLY["org.freedesktop.DBus.Error.ServiceUnknown"],
                )
            self._daemon = str(reply.body[0])
            self.conn.keep_signals_from = self._daemon
        return self._daemon

    def add_signal_match(self, member: str, interface: str = MANAGER_IFACE) -> None:
        """Sent without waiting for its reply: the bus handles our messages
        in order, so the match is in place before a call sent after it
        reaches the daemon. Should the bus refuse the match (its limit on
        matches), callers still learn of the end by asking (POLL_SECONDS)."""
        sender = self.daemon_name()
        self.conn.send(Message(
            METHOD_CALL, destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus", member="AddMatch", signature="s",
            body=[f"type='signal',sender='{sender}',path='{OBJECT_PATH}',"
                  f"interface='{interface}',member='{member}'"],
        ))  # fmt: skip

    def watch_restarts(self) -> None:
        """Ask the bus to say when the daemon's name changes hands (a restart):
        the new daemon does not know this connection, and has a new unique
        name that signals are then trusted from (see new_daemon)."""
        self.daemon_name()
        self.conn.send(Message(
            METHOD_CALL, destination=DRIVER, path="/org/freedesktop/DBus", interface=DRIVER,
            member="AddMatch", signature="s", body=[RESTART_MATCH],
        ))  # fmt: skip

    def new_daemon(self, msg: Message) -> bool:
        """msg says a daemon now owns the name: signals are trusted from it
        from now on. False for any other message."""
        owner = new_owner(msg.type == SIGNAL, msg.sender, msg.interface, msg.member, msg.body)
        if owner is None:
            return False
        self._daemon = self.conn.keep_signals_from = owner
        return True

    def from_daemon(self, msg: Message, member: str, interface: str = MANAGER_IFACE) -> bool:
        return (
            msg.type == SIGNAL
            and self._daemon is not None
            and msg.sender == self._daemon
            and msg.path == OBJECT_PATH
            and msg.interface == interface
            and msg.member == member
        )

    def close(self) -> None:
        self.conn.close()
