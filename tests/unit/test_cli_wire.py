"""cli/wire.py (lev's blocking D-Bus client) and cli/toolfast.py (lev tool's
fast path) agree byte for byte with what they replace: dbus-fast's
marshaller and the tool registry / json."""

from __future__ import annotations

import json
from typing import Any

import dbus_fast
import pytest
from dbus_fast import Variant as DVariant

from leviathd.broker.schema import args_from_positional
from leviathd.cli import toolfast, wire
from leviathd.domain.tools import TOOLS
from leviathd.errors import InvalidArgument

SIG = "a{sv}hhhasa{ss}ba(yv)tdxnqyoga{sas}"


def body(variant: Any) -> list[Any]:
    return [
        {"workdir": variant("s", "/w ü"), "env": variant("a{ss}", {"A": "b", "": ""}),
         "n": variant("i", -3), "l": variant("aa{sv}", [{"x": variant("t", 1)}])},
        0, 1, 2, ["x", ""], {}, True, [[1, variant("u", 7)]], 2**40, 1.5, -(2**40), -2, 65535,
        255, "/org/x", "a{sv}", {"k": ["a", "b"], "": []},
    ]  # fmt: skip


def test_a_method_call_is_encoded_as_dbus_fast_encodes_it() -> None:
    ours = wire.encode(wire.Message(
        wire.METHOD_CALL, serial=5, path="/org/leviath/Manager1", interface="org.x.Y",
        member="RunAttached", destination="org.leviath.Manager1", signature=SIG,
        body=body(wire.Variant), unix_fds=[0, 1, 2],
    ))  # fmt: skip
    theirs = dbus_fast.Message(
        destination="org.leviath.Manager1", path="/org/leviath/Manager1", interface="org.x.Y",
        member="RunAttached", signature=SIG, body=body(DVariant), unix_fds=[0, 1, 2], serial=5,
    )._marshall(negotiate_unix_fd=True)
    assert ours == bytes(theirs)


def test_messages_from_dbus_fast_are_read_back_with_their_descriptors() -> None:
    msg = dbus_fast.Message(
        message_type=dbus_fast.MessageType.METHOD_RETURN, reply_serial=5, signature=SIG,
        body=body(DVariant), unix_fds=[7, 8, 9], serial=9,
    )
    data = bytes(msg._marshall(negotiate_unix_fd=True))
    buf, fds = bytearray(data * 2), [30, 31, 32, 40, 41, 42]
    # Incomplete: nothing is taken yet.
    assert wire.parse(bytearray(data[:-1]), [30]) is None
    first = wire.parse(buf, fds)
    assert first is not None and first.type == wire.METHOD_RETURN and first.reply_serial == 5
    assert first.body == body(wire.Variant) and first.unix_fds == [30, 31, 32]
    second = wire.parse(buf, fds)
    assert second is not None and second.unix_fds == [40, 41, 42] and buf == bytearray()


def test_malformed_messages_raise_instead_of_reading_past_their_end() -> None:
    msg = dbus_fast.Message(
        message_type=dbus_fast.MessageType.METHOD_RETURN, reply_serial=5, signature="as",
        body=[["abc"]], serial=9,
    )
    data = bytearray(msg._marshall(False))
    # The string's length says more than the message holds.
    data[-8:-4] = (10**6).to_bytes(4, "little")
    with pytest.raises(wire.WireError):
        wire.parse(data, [])
    with pytest.raises(wire.WireError):
        wire.parse(bytearray(b"x" * 32), [])


def test_the_fast_tool_table_is_the_brokers() -> None:
    got = {
        name: (tuple(spec.positional), spec.variadic,
               next((p.type for p in spec.params if p.name == spec.variadic), None))
        for name, spec in TOOLS.items()
    }  # fmt: skip
    assert got == toolfast.POSITIONAL


@pytest.mark.parametrize("name", [*TOOLS, "no_such_tool"])
@pytest.mark.parametrize("values", [[], ["a"], ["a", "b"], ["a", "b", "c", "d"]])
def test_fast_positional_arguments_match_the_schema(name: str, values: list[str]) -> None:
    try:
        expected: dict[str, Any] | None = args_from_positional(name, values)
    except InvalidArgument:
        expected = None
    assert toolfast.positional_args(name, values) == expected


@pytest.mark.parametrize("value", [
    {"op": "call", "tool": "x", "args": {"path": "é \n \" \\ \udcff", "n": [1, True, None]}},
    {}, [], "", 0, -5, False,
])  # fmt: skip
def test_fast_json_round_trips_as_json_does(value: Any) -> None:
    text = toolfast.dumps(value)
    assert json.loads(text) == value
    assert toolfast.loads(json.dumps(value)) == value
    for bad in ("", "{", '{"a": 1} x', "[1,]"):
        with pytest.raises(ValueError):
            toolfast.loads(bad)


@pytest.mark.parametrize("piece", [1, 7, 4096])
def test_the_handshake_is_read_in_whatever_pieces_the_bus_sends(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    """The lines and the reply to Hello, one byte at a time or all at once
    (as dbus-daemon sends them): the messages after the lines are kept."""
    import socket
    import threading

    path = str(tmp_path / "bus")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    hello = wire.encode(wire.Message(
        wire.METHOD_RETURN, serial=1, reply_serial=1, sender="org.freedesktop.DBus",
        signature="s", body=[":1.42"],
    ))  # fmt: skip
    answer = b"OK 0123456789abcdef\r\nAGREE_UNIX_FD\r\n" + hello

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            got = b""
            while b"BEGIN\r\n" not in got:
                got += conn.recv(4096)
            for at in range(0, len(answer), piece):
                conn.sendall(answer[at : at + piece])
            conn.recv(1)  # until the client closes

    thread = threading.Thread(target=serve)
    thread.start()
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={path}")
    try:
        conn = wire.Connection()
        assert conn.unique_name == ":1.42"
        conn.close()
    finally:
        thread.join(5)
        server.close()


# --- the daemon's name changing hands (an attached run over a restart) -------

def _owner_changed(sender: str | None = "org.freedesktop.DBus", **over: object) -> wire.Message:
    fields: dict[str, Any] = dict(
        path="/org/freedesktop/DBus", interface="org.freedesktop.DBus",
        member="NameOwnerChanged", sender=sender, signature="sss",
        body=["org.leviath.Manager1", "", ":1.77"],
    )
    fields.update(over)
    return wire.Message(wire.SIGNAL, **fields)


def _bare_client() -> wire.SyncClient:
    # No bus: only the bookkeeping of whom signals are trusted from.
    client = wire.SyncClient.__new__(wire.SyncClient)
    client.conn = wire.Connection.__new__(wire.Connection)
    client.conn.keep_signals_from = ":1.5"
    client.conn.signals = []
    client._daemon = ":1.5"
    return client


def test_the_bus_naming_a_new_daemon_moves_trust_to_it() -> None:
    client = _bare_client()
    assert client.new_daemon(_owner_changed())
    assert client.conn.keep_signals_from == ":1.77"
    ended = wire.Message(wire.SIGNAL, sender=":1.77", path="/org/leviath/Manager1",
                    interface="org.leviath.Manager1", member="AgentEnded")
    assert client.from_daemon(ended, "AgentEnded")


@pytest.mark.parametrize("forged", [
    _owner_changed(sender=":1.66"),  # another client, unicasting a look-alike
    _owner_changed(sender=None),
    _owner_changed(member="NameAcquired"),
    _owner_changed(interface="org.leviath.Manager1"),
    _owner_changed(body=["org.other.Name", "", ":1.77"]),
    _owner_changed(body=["org.leviath.Manager1", ":1.5", ""]),  # the old one leaving
    _owner_changed(body=["org.leviath.Manager1", ":1.77"]),
], ids=["other-sender", "no-sender", "member", "interface", "other-name", "left", "short"])
def test_nothing_but_the_bus_naming_a_new_owner_moves_trust(forged: wire.Message) -> None:
    client = _bare_client()
    assert not client.new_daemon(forged)
    assert client.conn.keep_signals_from == ":1.5" and client._daemon == ":1.5"


def test_signals_are_kept_only_from_the_daemon_and_the_bus() -> None:
    conn = _bare_client().conn
    for sender in (":1.5", "org.freedesktop.DBus", ":1.66", None):
        conn._keep(_owner_changed(sender=sender))
    assert [m.sender for m in conn.signals] == [":1.5", "org.freedesktop.DBus"]


def test_a_body_cut_anywhere_raises_wire_error_and_nothing_else() -> None:
    # The reader's bounds (inlined for speed, issue 34) hold at every byte: a
    # message whose header claims a shorter body is refused, never read past.
    msg = dbus_fast.Message(
        message_type=dbus_fast.MessageType.METHOD_RETURN, reply_serial=5, signature=SIG,
        body=body(DVariant), serial=9,
    )
    data = bytes(msg._marshall(False))
    body_len = int.from_bytes(data[4:8], "little")
    head_len = len(data) - body_len
    for cut in range(body_len):
        short = bytearray(data[:4] + cut.to_bytes(4, "little") + data[8 : head_len + cut])
        with pytest.raises(wire.WireError):
            wire.parse(short, [])
