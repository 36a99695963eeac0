"""Issue 30 item 5: kind "azure" at the egress. The agent's sign-in answered
by the daemon (pure), and the daemon's own client-credentials flow on real
sockets against a stand-in authority (a TLS server on loopback, its
certificate from a test CA): the token comes back and is cached, a refusal
or an authority whose certificate does not verify gives a reason that never
holds the secret, and an overlong answer is refused."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import urllib.parse
from pathlib import Path

import pytest
from test_proxy_inject import Upstream

from leviathd.config.models import CredentialConfig
from leviathd.proxy import azure, inject

KEY = b"a" * 32
TENANT = "tenant-1"
CLIENT = "client-1"
SECRET = "sp-secret-value"


def pair() -> tuple[inject.Injection, inject.Injection]:
    return azure.injections("az", hosts=("management.azure.com",),
                            authority="login.microsoftonline.com", tenant=TENANT,
                            client_id=CLIENT, key=KEY)


def token_request(secret: str, *, client: str = CLIENT, grant: str = "client_credentials"
                  ) -> tuple[inject.Request, bytes]:
    body = urllib.parse.urlencode({"client_id": client, "client_secret": secret,
                                   "grant_type": grant, "scope": "x/.default"}).encode()
    req = inject.parse_head(f"POST /{TENANT}/oauth2/v2.0/token HTTP/1.1\r\n"
                            f"Content-Length: {len(body)}".encode())
    return req, body


def test_the_config_defaults_to_resource_manager_and_needs_the_principal() -> None:
    c = CredentialConfig.model_validate({"kind": "azure", "tenant": TENANT, "client_id": CLIENT,
                                         "secret_file": "/etc/s"})
    assert c.hosts == ["management.azure.com"] and c.authority == "login.microsoftonline.com"
    with pytest.raises(ValueError, match="tenant and client_id"):
        CredentialConfig.model_validate({"kind": "azure", "secret_file": "/etc/s"})
    with pytest.raises(ValueError):
        CredentialConfig.model_validate({"kind": "azure", "tenant": "a/../b",
                                         "client_id": CLIENT, "secret_file": "/etc/s"})


def test_the_sign_in_with_the_placeholder_gets_the_placeholder_token() -> None:
    manage, login = pair()
    req, body = token_request(login.placeholder)
    answer = azure.local_answer(login, manage, req, body)
    head, _, data = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    got = json.loads(data)
    assert got["access_token"] == manage.placeholder and got["token_type"] == "Bearer"
    assert manage.placeholder.count(".") == 2 and inject.PLACEHOLDER_PREFIX in manage.placeholder
    assert manage.placeholder != login.placeholder


@pytest.mark.parametrize("secret,client,grant", [
    ("a-guess", CLIENT, "client_credentials"),
    ("PH", "another-app", "client_credentials"),
    ("PH", CLIENT, "password"),
])
def test_any_other_sign_in_is_refused_here(secret: str, client: str, grant: str) -> None:
    manage, login = pair()
    req, body = token_request(login.placeholder if secret == "PH" else secret, client=client,
                              grant=grant)
    with pytest.raises(inject.Refusal):
        azure.local_answer(login, manage, req, body)


def test_only_the_tenants_token_endpoint_is_answered() -> None:
    manage, login = pair()
    egress = azure.AzureEgress.of((manage, login), principal=lambda n: None, secret=None,
                                  connect=None, upstream=None)
    assert egress is not None

    async def ask(path: str, method: str = "POST") -> object:
        req = inject.parse_head(f"{method} {path} HTTP/1.1\r\nContent-Length: 0".encode())
        reader = asyncio.StreamReader()
        reader.feed_eof()
        try:
            return await egress.answer("login.microsoftonline.com", 443, req, reader)
        except inject.Refusal as exc:
            return exc.status

    assert asyncio.run(ask(f"/{TENANT}/v2.0/.well-known/openid-configuration", "GET")) is None
    assert asyncio.run(ask("/other-tenant/oauth2/v2.0/token")) is None
    assert asyncio.run(ask(f"/{TENANT}/oauth2/v2.0/token")) == 403  # an empty form


# ---------------------------------------------------------------- on real sockets


class Authority(Upstream):
    """The stand-in authority: a token for the right secret, else a refusal
    that echoes what it got (as a hostile or broken one might)."""

    def __init__(self, tmp: Path, *, reply: bytes | None = None, **kw: object) -> None:
        super().__init__(tmp, **kw)  # type: ignore[arg-type]
        self.reply = reply

    async def serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head = await r.readuntil(b"\r\n\r\n")
            n = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                     if line.lower().startswith(b"content-length:"))
            body = await r.readexactly(n)
            self.heads.append(head)
            self.bodies.append(body)
            form = urllib.parse.parse_qs(body.decode())
            if self.reply is not None:
                data = self.reply
            elif form.get("client_secret") == [SECRET]:
                data = json.dumps({"access_token": f"tok-{len(self.heads)}",
                                   "expires_in": 3600, "token_type": "Bearer"}).encode()
            else:
                data = json.dumps({"error": "invalid_client",
                                   "error_description": f"bad {form['client_secret'][0]}"}
                                  ).encode()
            status = b"200 OK" if b"access_token" in data else b"401 Unauthorized"
            w.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: "
                    + str(len(data)).encode() + b"\r\n\r\n" + data)
            await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, StopIteration):
            pass
        finally:
            w.close()


async def _egress(up: Authority, secret: str, fetches: int = 1) -> list[str]:
    server = await asyncio.start_server(up.serve, "127.0.0.1", 0, ssl=up.server_ctx)
    port = server.sockets[0].getsockname()[1]

    async def connect(host: str, p: int) -> socket.socket:
        assert (host, p) == ("localhost", port)
        s = socket.socket()
        s.setblocking(False)
        await asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", port))
        return s

    async def read_secret(name: str) -> str:
        return secret

    manage, login = pair()
    egress = azure.AzureEgress.of(
        (manage, login), secret=read_secret, connect=connect, upstream=up.client_ctx,
        principal=lambda n: azure.Principal(TENANT, CLIENT, f"localhost:{port}", "s/.default"))
    assert egress is not None
    read = egress.wrap(read_secret)
    try:
        out = []
        for _ in range(fetches):
            try:
                out.append(await read("az"))
            except (ValueError, OSError) as exc:
                out.append(f"error: {exc}")
        return out
    finally:
        server.close()
        await server.wait_closed()


def test_the_daemon_gets_a_token_once_and_caches_it(tmp_path: Path) -> None:
    up = Authority(tmp_path)
    assert asyncio.run(_egress(up, SECRET, fetches=3)) == ["tok-1"] * 3
    assert len(up.heads) == 1 and up.heads[0].startswith(f"POST /{TENANT}/oauth2/v2.0/token "
                                                         .encode())
    assert urllib.parse.parse_qs(up.bodies[0].decode()) == {
        "grant_type": ["client_credentials"], "client_id": [CLIENT],
        "client_secret": [SECRET], "scope": ["s/.default"]}


def test_a_refusal_says_why_without_the_secret(tmp_path: Path) -> None:
    up = Authority(tmp_path)
    [got] = asyncio.run(_egress(up, "wrong-" + SECRET))
    assert got.startswith("error: the authority refused the sign-in (401 invalid_client)")
    assert SECRET not in got


def test_an_authority_whose_certificate_does_not_verify_gets_no_secret(tmp_path: Path) -> None:
    up = Authority(tmp_path, trusted=False)
    up.client_ctx = ssl.create_default_context()  # the system's CAs: not this one
    [got] = asyncio.run(_egress(up, SECRET))
    assert "does not verify" in got and up.bodies == []


def test_an_overlong_answer_is_refused(tmp_path: Path) -> None:
    up = Authority(tmp_path, reply=b'{"access_token": "' + b"x" * azure.MAX_RESPONSE + b'"}')
    [got] = asyncio.run(_egress(up, SECRET))
    assert got.startswith("error: the authority's answer is over")


def test_the_proxys_snapshot_keeps_both_entries_as_they_were() -> None:
    """After a daemon restart the proxy is rebuilt from its snapshot
    (proxy/service.py recover): the authority's entry keeps its app, its
    tenant and its empty header (it must never get a secret)."""
    for inj in pair():
        assert inject.Injection.from_json(json.loads(json.dumps(inj.to_json()))) == inj
    assert pair()[1].kind in inject.INTERCEPT_ONLY


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_the_daemons_connection_to_an_authority_on_loopback_is_refused(host: str) -> None:
    """Issue 50: the daemon's own connection to the authority goes only
    where the agent's proxy would let the agent go. A user's credential
    naming the host's loopback (a service of root's listening there) gets
    no connection from root: refused before any connect (seen failing with
    the address check skipped: the connection was made)."""
    from leviathd.proxy.policy import ProxySettings

    async def go() -> str:
        def close(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.close()

        server = await asyncio.start_server(close, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            connect = azure.checked_connect(ProxySettings(), uid=65534, agent="0123abcd")
            try:
                sock = await connect(host, port)
            except ValueError as exc:
                said = str(exc)
            else:
                sock.close()
                said = "connected"
            return said
        finally:
            server.close()
            await server.wait_closed()

    said = asyncio.run(go())
    assert said.startswith(f"refusing the authority {host}"), said


def test_an_authority_that_resolves_to_nothing_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No address is no connection (and no secret): refused by name. The
    resolver is a stand-in that answers nothing."""
    from leviathd.proxy import resolve
    from leviathd.proxy.policy import ProxySettings

    class Empty:
        async def resolve(self, host: str, port: int, *, uid: int, agent: str) -> list[str]:
            return []

    monkeypatch.setattr(resolve, "shared", lambda: Empty())
    connect = azure.checked_connect(ProxySettings(), uid=65534, agent="0123abcd")
    with pytest.raises(ValueError, match="no address"):
        asyncio.run(connect("login.example", 443))
