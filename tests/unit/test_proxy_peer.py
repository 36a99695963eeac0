"""Issue 30, network = true: the kernel's word on who connected to a
loopback port (leviathd/proxy/peer.py), on real sockets, and the per-URL
proxy file git includes (proxy/egress.py)."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from leviathd.proxy import egress, peer


def _own_cgroup() -> str:
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        for line in f:
            if line.startswith("0::"):
                return line.rstrip("\n")[3:]
    pytest.skip("no unified cgroup hierarchy here")


def _pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    return listener, client, accepted


def test_the_peer_of_a_loopback_connection_is_its_owner_and_cgroup() -> None:
    listener, client, accepted = _pair()
    try:
        found = peer.lookup(accepted)
        assert found is not None and found.uid == os.getuid()
        mount = peer.cgroup2_mount()
        assert mount is not None
        assert found.cgroup_id == os.stat(mount + _own_cgroup().rstrip("/")).st_ino
        if os.geteuid() == 0:  # open_by_handle_at needs CAP_DAC_READ_SEARCH
            assert peer.cgroup_path(found.cgroup_id) == _own_cgroup()
    finally:
        for s in (listener, client, accepted):
            s.close()


def test_a_socket_made_by_another_user_is_seen_as_that_users() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to connect as another uid")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(60)  # a child that failed to start fails the test, not hangs it
    port = listener.getsockname()[1]
    code = (f"import socket,sys; s=socket.create_connection(('127.0.0.1',{port})); "
            "sys.stdin.read()")
    proc = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                             "/usr/bin/python3", "-I", "-c", code], stdin=subprocess.PIPE)
    try:
        accepted, _ = listener.accept()
        found = peer.lookup(accepted)
        assert found is not None and found.uid == 65534
        accepted.close()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
        listener.close()


def test_an_unknown_cgroup_id_has_no_path() -> None:
    assert peer.cgroup_path(2**62 + 12345) is None


def test_the_gitconfig_names_the_port_for_each_host_git_can_match() -> None:
    data = egress.gitconfig(["git.test", "*.corp.test", "git.test:8443", "a?b.test",
                             'x"y.test', "git.test"], 4711).decode()
    assert data == ('[http "https://git.test/"]\n\tproxy = http://127.0.0.1:4711\n'
                    '[http "https://*.corp.test/"]\n\tproxy = http://127.0.0.1:4711\n'
                    '[http "https://git.test:8443/"]\n\tproxy = http://127.0.0.1:4711\n')



def test_an_adopted_agents_broker_gives_placeholders_before_it_serves(tmp_path: Path) -> None:
    """After a daemon restart the broker of an agent whose git credential is
    injected served calls before the proxy came back (and forever if it did
    not), handing `git credential fill` the token meanwhile: the placeholders
    are now set from the saved state when the broker is made."""
    from leviathd.proxy.service import ProxyService

    (tmp_path / "proxy").mkdir()
    (tmp_path / "proxy" / "0123abcd.json").write_text(json.dumps({"egress": {"injections": [
        {"name": "gitsrv", "kind": "git", "placeholder": "leviath-placeholder-x"},
        {"name": "api", "kind": "http", "placeholder": "leviath-placeholder-y"}]}}))
    gate = SimpleNamespace(broker_hooks=[])
    service = ProxyService(None, gate, state_dir=str(tmp_path))  # type: ignore[arg-type]
    assert gate.broker_hooks == [service.preset]  # the gate calls it for each new broker
    broker = SimpleNamespace(placeholder_for=None)
    service.preset("0123abcd", broker)  # type: ignore[arg-type]
    assert broker.placeholder_for is not None
    assert broker.placeholder_for("gitsrv") == "leviath-placeholder-x"
    assert broker.placeholder_for("api") is None  # an http token is never given to git
    other = SimpleNamespace(placeholder_for=None)
    service.preset("ffffffff", other)  # type: ignore[arg-type]
    assert other.placeholder_for is None  # no saved state: a new agent, set at its start


def test_the_host_port_serves_the_agents_user_only_even_inside_its_cgroup(
        tmp_path: Path) -> None:
    """Issue 50: the loopback port of a `network = true` agent serves a
    socket made inside the agent's scope by the agent's user, and no one
    else. Here every process of this test's cgroup is "the agent's", so a
    connection from another uid made in the same cgroup (what a set-uid
    program the agent runs would make) is told apart by its uid alone:
    closed unanswered, while the agent's own uid gets the proxy's answer
    (seen failing with the uid comparison dropped)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: open_by_handle_at, and connecting as another uid")
    import asyncio

    from leviathd.domain.sensitivity import Sensitivity
    from leviathd.proxy.policy import ProxySettings
    from leviathd.proxy.server import Agent, ProxyServer

    own = _own_cgroup()
    code = ("import socket,sys\n"
            "s=socket.create_connection(('127.0.0.1',int(sys.argv[1])),timeout=20)\n"
            "try:\n"
            "    s.sendall(b'GET / HTTP/1.1\\r\\nHost: x.test\\r\\n\\r\\n')\n"
            "    got=s.recv(4096)\n"
            "except ConnectionError:\n"
            "    got=b''\n"
            "sys.stdout.buffer.write(got or b'<closed>')\n")

    async def as_uid(uid: int, port: int) -> bytes:
        proc = await asyncio.create_subprocess_exec(
            "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "/usr/bin/python3", "-I", "-c", code, str(port), stdout=subprocess.PIPE)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        return out

    async def go(scope: str) -> tuple[bytes, bytes]:
        agent = Agent(id="0123abcd", user="u", uid=0, gid=0,
                      taint=lambda: Sensitivity.PUBLIC, approvals=lambda: None,
                      is_own=lambda cg: cg.rstrip("/") == scope.rstrip("/"))
        (tmp_path / "proxy.sock").unlink(missing_ok=True)
        srv = ProxyServer(agent, ProxySettings(), str(tmp_path / "proxy.sock"), lambda r: None)
        await srv.start()
        try:
            port = srv.listen_host()
            return await as_uid(0, port), await as_uid(65534, port)
        finally:
            await srv.close()

    mine, other = asyncio.run(go(own))
    assert mine.startswith(b"HTTP/1.1 "), mine  # the agent's user is answered
    assert other == b"<closed>", other
    # The agent's user outside the agent's scope (her shell, another agent
    # of hers): closed unanswered too.
    mine, other = asyncio.run(go(own.rstrip("/") + "/leviath-u-x-0123abcd.scope"))
    assert (mine, other) == (b"<closed>", b"<closed>"), (mine, other)


def test_an_answer_about_another_socket_names_no_peer() -> None:
    """The kernel's answer is taken only for the socket asked about: a reply
    whose ports are not the peer's (another connection's) decides nothing."""
    listener, client, accepted = _pair()
    try:
        ours, theirs = accepted.getsockname()[:2], accepted.getpeername()[:2]
        body = bytearray(72)
        body[4:8] = struct.pack("!HH", theirs[1], ours[1])
        body[64:68] = struct.pack("=I", 1000)
        body += struct.pack("=HHQ", 12, peer.INET_DIAG_CGROUP_ID, 4242)
        head = struct.pack("=IHHII", 16 + len(body), peer.SOCK_DIAG_BY_FAMILY, 0, 1, 0)
        found = peer._parse(head + bytes(body), theirs, ours)
        assert found == peer.TcpPeer(uid=1000, cgroup_id=4242)
        other = bytearray(body)
        other[4:8] = struct.pack("!HH", theirs[1] ^ 1, ours[1])
        head = struct.pack("=IHHII", 16 + len(other), peer.SOCK_DIAG_BY_FAMILY, 0, 1, 0)
        assert peer._parse(head + bytes(other), theirs, ours) is None
        # No cgroup in the answer (an older kernel): no answer either.
        head = struct.pack("=IHHII", 16 + 72, peer.SOCK_DIAG_BY_FAMILY, 0, 1, 0)
        assert peer._parse(head + bytes(body[:72]), theirs, ours) is None
    finally:
        for s in (listener, client, accepted):
            s.close()


def test_a_peer_the_kernel_cannot_name_is_never_served(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection whose socket the kernel's diagnostics do not find (it
    closed, an older kernel without cgroup ids) is closed unanswered: no
    answer is no identity. The lookup is made to find nothing here."""
    import asyncio

    from leviathd.domain.sensitivity import Sensitivity
    from leviathd.proxy.policy import ProxySettings
    from leviathd.proxy.server import Agent, ProxyServer

    monkeypatch.setattr(peer, "lookup", lambda conn: None)

    async def go() -> bytes:
        agent = Agent(id="0123abcd", user="u", uid=os.getuid(), gid=os.getgid(),
                      taint=lambda: Sensitivity.PUBLIC, approvals=lambda: None,
                      is_own=lambda cg: True)
        srv = ProxyServer(agent, ProxySettings(), str(tmp_path / "proxy.sock"), lambda r: None)
        await srv.start()
        try:
            port = srv.listen_host()
            r, w = await asyncio.open_connection("127.0.0.1", port)
            try:
                w.write(b"GET / HTTP/1.1\r\nHost: x.test\r\n\r\n")
                await w.drain()
                return await asyncio.wait_for(r.read(), 20)
            except ConnectionError:
                return b""
            finally:
                w.close()
        finally:
            await srv.close()

    assert asyncio.run(go()) == b""
