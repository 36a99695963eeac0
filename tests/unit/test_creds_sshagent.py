"""The SSH agent's known_hosts mapping from a bound host key to a covered
name (issue 15 §3): ports, hashed names, @revoked, negations."""

from __future__ import annotations

import base64
import hashlib
import hmac

from leviathd.creds.knownhosts import covered_name

KEY = b"\x00\x00\x00\x0bssh-ed25519" + b"k" * 36
OTHER = b"\x00\x00\x00\x0bssh-ed25519" + b"o" * 36
B64 = base64.b64encode(KEY).decode()


def hashed(name: str) -> str:
    salt = b"0123456789abcdefghij"
    mac = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(mac).decode()}"


def test_a_plain_name_on_port_22_or_a_named_port() -> None:
    text = f"git.example.com,10.0.0.1 ssh-ed25519 {B64}\n[127.0.0.1]:2222 ssh-ed25519 {B64}\n"
    assert covered_name(text, KEY, ("*.example.com",)) == "git.example.com"
    assert covered_name(text, KEY, ("127.0.0.1:2222",)) == "[127.0.0.1]:2222"
    assert covered_name(text, KEY, ("127.0.0.1",)) is None  # port 22 is another host
    assert covered_name(text, KEY, ("other.org",)) is None
    assert covered_name(text, OTHER, ("*.example.com",)) is None


def test_a_hashed_name_is_found_by_an_exact_pattern_only() -> None:
    text = f"{hashed('git.example.com')} ssh-ed25519 {B64}\n"
    assert covered_name(text, KEY, ("git.example.com",)) == "git.example.com"
    assert covered_name(text, KEY, ("*.example.com",)) is None
    text = f"{hashed('[h]:2200')} ssh-ed25519 {B64}\n"
    assert covered_name(text, KEY, ("h:2200",)) == "[h]:2200"


def test_a_revoked_key_covers_nothing_and_negations_and_cas_are_skipped() -> None:
    good = f"git.example.com ssh-ed25519 {B64}\n"
    assert covered_name(good + f"@revoked * ssh-ed25519 {B64}\n", KEY, ("git.example.com",)) \
        is None
    assert covered_name(f"git.example.com,!bad.example.com ssh-ed25519 {B64}\n", KEY,
                        ("git.example.com",)) is None
    assert covered_name(f"@cert-authority git.example.com ssh-ed25519 {B64}\n", KEY,
                        ("git.example.com",)) is None
    assert covered_name("# comment\n\ngarbage\nx y !!!\n" + good, KEY,
                        ("git.example.com",)) == "git.example.com"


# ------------------------------------------------------------------ the server
# A real Broker (broker_harness) and a real SSHAgentServer on a unix socket;
# the test is the client, playing both OpenSSH and an agent that lies.

import asyncio  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402

import asyncssh  # noqa: E402
import pytest  # noqa: E402
from asyncssh.packet import Boolean, Byte, String, UInt32  # noqa: E402
from broker_harness import Running, running_broker  # noqa: E402

from leviathd.creds.sshagent import SSHAgentServer  # noqa: E402
from leviathd.domain.credentials import CredentialSpec  # noqa: E402
from leviathd.policy.settings import PolicySettings  # noqa: E402

HOST = asyncssh.generate_private_key("ssh-ed25519")
STRANGER = asyncssh.generate_private_key("ssh-ed25519")


@contextmanager
def agent_socket(tmp: str, permissions: dict[str, object] | None = None
                 ) -> Iterator[tuple[str, Running, asyncssh.SSHKey]]:
    user_key = asyncssh.generate_private_key("ssh-ed25519")
    key_file = os.path.join(tmp, "id")
    user_key.write_private_key(key_file)
    known = os.path.join(tmp, "known_hosts")
    with open(known, "w") as f:
        f.write(f"[git.example.com]:2222 {HOST.export_public_key().decode()}")
    spec = CredentialSpec((), key_file, kind="ssh", hosts=("git.example.com:2222",),
                          known_hosts=(known,))
    settings = PolicySettings(credentials={"deploy": spec}, permissions=permissions or {})
    with running_broker(home=tmp, workdir=tmp, settings=settings,
                        socket_path=os.path.join(tmp, "broker.sock")) as r:
        lookup = r.server.lookup
        server = SSHAgentServer(r.broker.agent_id, os.path.join(tmp, "agent.sock"),
                                lookup=lookup, broker_of=lambda: r.broker)
        asyncio.run_coroutine_threadsafe(server.start(os.getuid(), os.getgid()),
                                         r.loop).result(10)
        try:
            yield server.path, r, user_key
        finally:
            asyncio.run_coroutine_threadsafe(server.close(), r.loop).result(10)


class Client:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def ask(self, body: bytes) -> bytes:
        self.sock.sendall(struct.pack(">I", len(body)) + body)
        size = struct.unpack(">I", self.sock.recv(4))[0]
        data = b""
        while len(data) < size:
            data += self.sock.recv(size - len(data))
        return data

    def bind(self, host: asyncssh.SSHKey, session: bytes, *, forwarding: bool = False,
             signer: asyncssh.SSHKey | None = None) -> int:
        sig = (signer or host).sign(session, b"ssh-ed25519")
        return self.ask(Byte(27) + String(b"session-bind@openssh.com")
                        + String(host.public_data) + String(session) + String(sig)
                        + Boolean(forwarding))[0]

    def sign(self, key: asyncssh.SSHKey, data: bytes) -> int:
        return self.ask(Byte(13) + String(key.public_data) + String(data) + UInt32(0))[0]


def userauth(session: bytes, key: asyncssh.SSHKey, user: bytes = b"git") -> bytes:
    return (String(session) + Byte(50) + String(user) + String(b"ssh-connection")
            + String(b"publickey") + Boolean(True) + String(b"ssh-ed25519")
            + String(key.public_data))


@pytest.fixture
def tmp() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        yield d


def test_it_signs_a_user_authentication_for_the_bound_covered_session(tmp: str) -> None:
    with agent_socket(tmp) as (path, r, key), Client(path) as c:
        assert c.bind(HOST, b"S" * 32) == 6
        assert c.sign(key, userauth(b"S" * 32, key)) == 14
        allowed = [a for a in r.audit if a.tool == "ssh_sign" and a.outcome == "allow"]
        assert allowed and allowed[-1].target == "[git.example.com]:2222"
        assert "'git'" in allowed[-1].detail


@pytest.mark.parametrize("case", ["no-bind", "forged-bind", "other-session", "not-userauth",
                                  "uncovered-host", "forwarded"])
def test_it_refuses_what_an_agent_could_make_up(tmp: str, case: str) -> None:
    with agent_socket(tmp) as (path, r, key), Client(path) as c:
        session, data_session, host = b"S" * 32, b"S" * 32, HOST
        if case == "forged-bind":
            assert c.bind(HOST, session, signer=STRANGER) == 5
            assert any(a.rule == "ssh-bind" for a in r.audit)
        elif case == "uncovered-host":
            host = STRANGER
        if case not in ("no-bind", "forged-bind"):
            assert c.bind(host, session, forwarding=case == "forwarded") == 6
        if case == "other-session":
            data_session = b"T" * 32
        data = b"\0" * 40 if case == "not-userauth" else userauth(data_session, key)
        assert c.sign(key, data) == 5
        denied = [a for a in r.audit if a.tool == "ssh_sign" and a.outcome == "deny"]
        assert denied, r.audit


def test_keys_cannot_be_added_and_the_listing_shows_the_public_half(tmp: str) -> None:
    with agent_socket(tmp) as (path, _, key), Client(path) as c:
        assert c.ask(Byte(17) + String(b"ssh-ed25519"))[0] == 5
        answer = c.ask(Byte(11))
        assert answer[0] == 12 and key.public_data in answer
        assert b"PRIVATE" not in answer


def test_ssh_sign_denied_by_permission_signs_nothing(tmp: str) -> None:
    with agent_socket(tmp, permissions={"ssh_sign": "deny"}) as (path, r, key), \
            Client(path) as c:
        assert c.bind(HOST, b"S" * 32) == 6
        assert c.sign(key, userauth(b"S" * 32, key)) == 5
        assert any("refused by policy" in a.detail for a in r.audit if a.tool == "ssh_sign")


def test_a_large_known_hosts_is_not_parsed_on_the_daemons_loop(
    tmp: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team: the known_hosts text is the user's (a `kind = "none"`
    agent's too), up to 1 MiB of hashed names, each tried against every
    covered pattern; parsed on the event loop, each sign request stalled
    every other user's calls for most of a second. Judged by where the
    parse ran (the loop's thread or not), not by a time: under load a
    timed bound failed with the parse off the loop all the same."""
    import threading

    from leviathd.creds import sshagent

    parsed_on: list[int] = []
    real = sshagent.covered_name

    def spy(text: str, hostkey: bytes, patterns: tuple[str, ...]) -> str | None:
        parsed_on.append(threading.get_ident())
        return real(text, hostkey, patterns)

    monkeypatch.setattr(sshagent, "covered_name", spy)
    pub = HOST.export_public_key().decode().split()
    names = ",".join(hashed(f"decoy{i}.example") for i in range(20))
    line = f"{names} {pub[0]} {pub[1]}\n"
    with agent_socket(tmp) as (path, r, key):
        known = os.path.join(tmp, "known_hosts")
        with open(known, "w") as f:
            f.write(line * ((1 << 20) // len(line) - 1))
            f.write(f"[git.example.com]:2222 {pub[0]} {pub[1]}\n")
        spec = r.broker.policy.settings.credentials["deploy"]
        many = CredentialSpec((), spec.secret_file, kind="ssh", known_hosts=(known,),
                              hosts=(*(f"h{i}.example" for i in range(20)),
                                     "git.example.com:2222"))
        r.broker.policy.settings.credentials["deploy"] = many  # type: ignore[index]

        async def loop_thread() -> int:
            return threading.get_ident()

        loop_id = asyncio.run_coroutine_threadsafe(loop_thread(), r.loop).result(10)
        with Client(path) as c:
            assert c.bind(HOST, b"S" * 32) == 6
            assert c.sign(key, userauth(b"S" * 32, key)) == 14
        assert parsed_on and loop_id not in parsed_on, (loop_id, parsed_on)
