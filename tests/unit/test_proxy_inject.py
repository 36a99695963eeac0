"""Issue 30: credentials injected at the egress. The pure parts (which
requests, how the head is rebuilt, the ref updates of a push) and the whole
path on real sockets: an agent's CONNECT to a covered host is answered by
the proxy with a leaf of the agent's CA, the request reaches a real TLS
server (its certificate from a test CA the proxy trusts) with the secret in
place of the placeholder, and what must not happen does not."""

from __future__ import annotations

import asyncio
import base64
import datetime
import os
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from leviathd.broker.core import AuditRecord
from leviathd.domain.sensitivity import Sensitivity
from leviathd.proxy import inject, receivepack
from leviathd.proxy.ca import AgentCA, constraint_names
from leviathd.proxy.policy import ProxySettings
from leviathd.proxy.server import Agent, Injector, ProxyServer

SECRET = "s3cr3t-token-value"
KEY = b"k" * 32


def injection(kind: str = "http", hosts: tuple[str, ...] = ("api.example.com",),
              **kw: object) -> inject.Injection:
    return inject.Injection(name=kw.pop("name", "gh"), kind=kind, hosts=hosts,  # type: ignore[arg-type]
                            placeholder=inject.placeholder(KEY, "gh"), **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- pure parts


def test_a_placeholder_is_per_key_and_name_and_tells_nothing_of_the_secret() -> None:
    a = inject.placeholder(KEY, "gh")
    assert a == inject.placeholder(KEY, "gh") and a != inject.placeholder(KEY, "gl")
    assert a != inject.placeholder(b"x" * 32, "gh") and SECRET not in a


def test_hosts_cover_port_443_unless_a_port_is_named() -> None:
    inj = injection(hosts=("api.example.com", "*.corp.test", "git.test:8443"))
    assert inject.covers(inj, "api.example.com", 443)
    assert not inject.covers(inj, "api.example.com", 8443)
    assert inject.covers(inj, "a.corp.test", 443) and inject.covers(inj, "git.test", 8443)
    assert not inject.covers(inj, "other.test", 443)
    assert constraint_names(inj.hosts) == ["api.example.com", "corp.test", "git.test"]


def _head(*headers: str, path: str = "/user", method: str = "GET") -> inject.Request:
    return inject.parse_head("\r\n".join([f"{method} {path} HTTP/1.1", *headers]).encode())


def test_the_placeholder_becomes_the_secret_in_its_header_only() -> None:
    inj = injection(value="token {secret}")
    ph = inj.placeholder
    head, used = inject.rebuild(_head("Host: evil.test", f"Authorization: token {ph}",
                                      "Accept: */*"), [inj], {"gh": SECRET},
                                host="api.example.com")
    text = head.decode()
    assert used == ["gh"] and f"Authorization: token {SECRET}\r\n" in text
    # Host is the verified host's, never the agent's (no fronting).
    assert "Host: api.example.com\r\n" in text and "evil.test" not in text
    assert ph not in text and text.endswith("Connection: close\r\n\r\n")


def test_no_header_gets_one_and_the_agents_own_value_is_kept() -> None:
    inj = injection()
    head, used = inject.rebuild(_head(), [inj], {"gh": SECRET}, host="api.example.com")
    assert f"Authorization: Bearer {SECRET}" in head.decode() and used == ["gh"]
    head, used = inject.rebuild(_head("Authorization: Bearer mine"), [inj], {"gh": SECRET},
                                host="api.example.com")
    assert "Bearer mine" in head.decode() and SECRET not in head.decode() and used == []


def test_the_placeholder_in_any_other_header_is_refused() -> None:
    inj = injection()
    for header in (f"X-Echo: {inj.placeholder}", f"Cookie: a={inj.placeholder}",
                   "Proxy-Auth: Basic " + base64.b64encode(f"u:{inj.placeholder}".encode()
                                                           ).decode()):
        with pytest.raises(inject.Refusal):
            inject.rebuild(_head(header), [inj], {"gh": SECRET}, host="api.example.com")


def test_git_basic_auth_carries_the_token_in_place_of_the_placeholder() -> None:
    inj = injection("git", username="x-access-token")
    basic = base64.b64encode(f"x-access-token:{inj.placeholder}".encode()).decode()
    head, used = inject.rebuild(_head(f"Authorization: Basic {basic}"), [inj], {"gh": SECRET},
                                host="git.test")
    want = base64.b64encode(f"x-access-token:{SECRET}".encode()).decode()
    assert f"Authorization: Basic {want}" in head.decode() and used == ["gh"]


def test_a_secret_with_a_line_break_is_never_put_in_a_header() -> None:
    with pytest.raises(ValueError):
        inject.check_secret("a\r\nX-Evil: 1")
    assert inject.check_secret("tok\n") == "tok"


def pkt(line: str) -> bytes:
    data = line.encode() + b"\n"
    return f"{len(data) + 4:04x}".encode() + data


OLD, NEW = "1" * 40, "2" * 40


def test_the_ref_updates_of_a_push_are_read_from_its_pkt_lines() -> None:
    body = (pkt(f"{OLD} {NEW} refs/heads/main\0report-status side-band-64k")
            + pkt(f"{receivepack.ZERO} {NEW} refs/heads/new") + b"0000PACK....")
    updates, end = receivepack.parse_commands(body)
    assert [u.text() for u in updates] == ["refs/heads/main: 111111111111 -> 222222222222",
                                           "refs/heads/new: create -> 222222222222"]
    assert body[end:] == b"PACK...."
    with pytest.raises(receivepack.Incomplete):
        receivepack.parse_commands(body[:30])
    with pytest.raises(ValueError):
        receivepack.parse_commands(pkt("hello world") + b"0000")


# ---------------------------------------------------------------- on real sockets


def _cert(name: str, issuer_key: ec.EllipticCurvePrivateKey | None = None,
          issuer: x509.Name | None = None, *, ca: bool = False
          ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer or subject)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(days=1))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    # The key identifiers and a CA's key usage: Python 3.13 verifies with
    # VERIFY_X509_STRICT, which refuses certificates without them ("Missing
    # Authority Key Identifier", seen in the Debian 13 VM's unit run).
    b = b.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                        critical=False)
    b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
        (issuer_key or key).public_key()), critical=False)
    if ca:
        b = b.add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
    else:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
    return key, b.sign(issuer_key or key, hashes.SHA256())


def _pem(path: Path, key: ec.EllipticCurvePrivateKey | None, *certs: x509.Certificate) -> str:
    data = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)
    if key is not None:
        data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()) + data
    path.write_bytes(data)
    return str(path)


class Upstream:
    """A TLS server for `localhost` recording each request head it gets."""

    def __init__(self, tmp: Path, *, trusted: bool = True, name: str = "localhost") -> None:
        ca_key, ca = _cert("test ca", ca=True)
        if trusted:
            key, cert = _cert(name, ca_key, ca.subject)
        else:  # self-signed: no CA vouches for it
            key, cert = _cert("localhost")
        self.server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_ctx.load_cert_chain(_pem(tmp / "up.pem", key, cert))
        self.client_ctx = ssl.create_default_context(cafile=_pem(tmp / "upca.pem", None, ca))
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []

    async def serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head = await r.readuntil(b"\r\n\r\n")
            self.heads.append(head)
            n = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")), 0)
            self.bodies.append(await r.readexactly(n) if n else b"")
            await self.after_body(r)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nfromup")
            await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            w.close()

    async def after_body(self, r: asyncio.StreamReader) -> None:
        """What happens between the request's body and the answer: nothing
        here (test_proxy_framing's Recording waits for stray bytes)."""


Asked = list[tuple[str, list[str]]]


async def _through_proxy(tmp: Path, up: Upstream, request: bytes, *,
                         push: str = "ask", answer: bool = True,
                         asked: Asked | None = None,
                         seen: list[AuditRecord] | None = None,
                         kind: str = "http", access: tuple[str, ...] = ("fetch",),
                         value: str = "token {secret}") -> bytes:
    server = await asyncio.start_server(up.serve, "127.0.0.1", 0, ssl=up.server_ctx)
    port = server.sockets[0].getsockname()[1]
    inj = (injection("git", hosts=(f"localhost:{port}",), access=access) if kind == "git"
           else injection("http", hosts=(f"localhost:{port}",), value=value))
    ca = AgentCA("0123abcd", inj.hosts)

    async def secret(name: str) -> str:
        assert name == "gh"
        return SECRET

    agent = Agent(id="0123abcd", user="u", uid=os.getuid(), gid=os.getgid(),
                  taint=lambda: Sensitivity.PUBLIC, approvals=lambda: None,
                  is_own=lambda _cg: True)
    proxy = ProxyServer(agent, ProxySettings(host_ports=(port,)), str(tmp / "proxy.sock"),
                        (seen if seen is not None else []).append,
                        Injector(ca=ca, injections=(inj,), secret=secret, push=push,
                                 upstream=up.client_ctx))
    ask: Callable[[str, list[str]], Awaitable[bool]]

    async def ask(repo: str, refs: list[str]) -> bool:
        (asked if asked is not None else []).append((repo, refs))
        return answer

    await proxy.start()
    try:
        r, w = await asyncio.open_unix_connection(str(tmp / "proxy.sock"))
        w.write(f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n".encode())
        await w.drain()
        assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        (tmp / "agentca.pem").write_bytes(ca.pem)
        agent_ctx = ssl.create_default_context(cafile=str(tmp / "agentca.pem"))
        await w.start_tls(agent_ctx, server_hostname="localhost")
        w.write(request.replace(b"PH", inj.placeholder.encode()))
        await w.drain()
        got = await asyncio.wait_for(r.read(), 10)
        w.close()
        return got
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


def test_the_secret_reaches_the_real_host_and_never_the_agent(tmp_path: Path) -> None:
    up = Upstream(tmp_path)
    seen: list[AuditRecord] = []
    got = asyncio.run(_through_proxy(
        tmp_path, up, b"GET /user HTTP/1.1\r\nHost: x\r\nAuthorization: token PH\r\n\r\n",
        seen=seen))
    assert got.endswith(b"fromup") and SECRET.encode() not in got
    assert len(up.heads) == 1 and f"Authorization: token {SECRET}".encode() in up.heads[0]
    inj = [r for r in seen if r.rule == "credential gh"]
    assert inj and inj[0].detail.startswith("GET /user") and SECRET not in inj[0].detail


class Echo(Upstream):
    """A covered host that says the request back in its answer (as an echo
    service, a debugging endpoint or an error page quoting its input does)."""

    async def serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head = await r.readuntil(b"\r\n\r\n")
            self.heads.append(head)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                    % len(head) + head)
            await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            w.close()


def test_a_host_that_says_the_request_back_never_gives_the_agent_the_secret(
        tmp_path: Path) -> None:
    """Issue 50: the answer of a covered host is masked (proxy/mask.py). The
    agent asks an echoing host through the proxy, with the placeholder: the
    host gets the secret, the agent reads the answer and finds no secret in
    it (seen failing with the answer copied unmasked)."""
    up = Echo(tmp_path)
    got = asyncio.run(_through_proxy(
        tmp_path, up, b"GET /echo HTTP/1.1\r\nHost: x\r\nAuthorization: token PH\r\n\r\n"))
    assert len(up.heads) == 1 and SECRET.encode() in up.heads[0]  # the host had it
    assert got.startswith(b"HTTP/1.1 200 ") and b"GET /echo" in got, got
    assert SECRET.encode() not in got, got


def test_a_fetch_only_git_credential_is_never_sent_with_a_push(tmp_path: Path) -> None:
    """Issue 50: a `kind = "git"` credential with `access = ["fetch"]` is
    injected into fetches only. The agent's git asks for the push service
    (receive-pack's discovery, what `git push` sends first) with the
    placeholder in Basic auth: the host never gets the token (seen failing
    with the access filter dropped), while a fetch gets it."""
    basic = base64.b64encode(
        f"x-access-token:{injection('git').placeholder}".encode()).decode()
    token = base64.b64encode(f"x-access-token:{SECRET}".encode())
    push = (b"GET /repo.git/info/refs?service=git-receive-pack HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Basic " + basic.encode() + b"\r\n\r\n")
    up = Upstream(tmp_path)
    got = asyncio.run(_through_proxy(tmp_path, up, push, push="allow", kind="git"))
    assert not any(token in h for h in up.heads), up.heads
    assert SECRET.encode() not in got and token not in got
    fetch = push.replace(b"git-receive-pack", b"git-upload-pack")
    up = Upstream(tmp_path)
    got = asyncio.run(_through_proxy(tmp_path, up, fetch, kind="git"))
    assert got.endswith(b"fromup") and len(up.heads) == 1 and token in up.heads[0], up.heads
    # With push access the same push discovery carries it.
    up = Upstream(tmp_path)
    asyncio.run(_through_proxy(tmp_path, up, push, push="allow", kind="git",
                               access=("fetch", "push")))
    assert len(up.heads) == 1 and token in up.heads[0], up.heads


def test_a_host_whose_certificate_does_not_verify_gets_no_secret(tmp_path: Path) -> None:
    up = Upstream(tmp_path, trusted=False)
    up.client_ctx = ssl.create_default_context()  # the system's CAs: not this self-signed one
    got = asyncio.run(_through_proxy(
        tmp_path, up, b"GET /user HTTP/1.1\r\nAuthorization: token PH\r\n\r\n"))
    assert b" 502 " in got and b"does not verify" in got and b"no credential was sent" in got
    assert up.heads == []


def test_a_host_whose_certificate_names_another_host_gets_no_secret(tmp_path: Path) -> None:
    up = Upstream(tmp_path, name="elsewhere.test")  # a good CA, the wrong name
    got = asyncio.run(_through_proxy(
        tmp_path, up, b"GET /user HTTP/1.1\r\nAuthorization: token PH\r\n\r\n"))
    assert b" 502 " in got and b"does not verify" in got and SECRET.encode() not in got
    assert up.heads == []


def test_the_placeholder_in_another_header_is_refused_before_anything_is_sent(
        tmp_path: Path) -> None:
    up = Upstream(tmp_path)
    got = asyncio.run(_through_proxy(
        tmp_path, up, b"GET /echo HTTP/1.1\r\nX-Echo: PH\r\n\r\n"))
    assert b" 403 " in got and up.heads == []


def test_a_push_waits_for_its_answer_which_names_the_refs(tmp_path: Path) -> None:
    body = pkt(f"{OLD} {NEW} refs/heads/main\0report-status") + b"0000PACKDATA"
    req = (b"POST /repo.git/git-receive-pack HTTP/1.1\r\nAuthorization: token PH\r\n"
           b"Content-Type: application/x-git-receive-pack-request\r\n"
           + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    asked: Asked = []
    up = Upstream(tmp_path)
    got = asyncio.run(_through_proxy(tmp_path, up, req, answer=False, asked=asked))
    assert b" 403 " in got and up.heads == []
    # (the kind "http" credential has no push access of git's, but the
    # request is a push all the same: it is asked about, refused here)
    up = Upstream(tmp_path)
    got = asyncio.run(_through_proxy(tmp_path, up, req, push="allow"))
    assert got.endswith(b"fromup") and up.bodies == [body]


def test_a_secret_that_cannot_be_read_is_a_502_and_nothing_is_sent(tmp_path: Path) -> None:
    up = Upstream(tmp_path)

    async def go() -> bytes:
        import leviathd.proxy.tls as t

        real = t.intercept

        async def failing(*a: object, **kw: object) -> t.Outcome:
            async def nosecret(_name: str) -> str:
                from leviathd.errors import NotFound
                raise NotFound("cannot read the credential's secret file")
            kw["secret"] = nosecret
            return await real(*a, **kw)  # type: ignore[arg-type]

        t.intercept = failing  # type: ignore[assignment]
        try:
            return await _through_proxy(
                tmp_path, up, b"GET /user HTTP/1.1\r\nAuthorization: token PH\r\n\r\n")
        finally:
            t.intercept = real  # type: ignore[assignment]

    got = asyncio.run(go())
    assert b" 502 " in got and b"unavailable" in got and up.heads == []


def test_the_sandbox_gets_the_bundle_the_placeholder_and_an_inspect_note() -> None:
    from test_sandbox_spec import spec_for

    from leviathd.config.merge import Effective
    from leviathd.config.models import CredentialConfig, SandboxKind
    from leviathd.proxy import egress
    from leviathd.sandbox.spec import Mount

    cred = CredentialConfig(kind="http", hosts=["api.test"], token_env="GH_TOKEN",
                            secret_file="/etc/x")
    eff = Effective(kind=SandboxKind.NAMESPACE, credentials={"api": cred})
    spec = spec_for(eff)
    spec = type(spec)(**{**spec.__dict__, "mounts": (*spec.mounts, Mount(
        "bind", "/run/leviath", "/run/leviath/agents/x", readonly=True, why="broker"))})
    out = egress.extend_env(spec, eff, KEY)
    assert out.env["GH_TOKEN"] == inject.placeholder(KEY, "api")
    assert all(out.env[v] == "/run/leviath/ca-bundle.pem" for v in egress.TRUST_VARIABLES)
    assert any("credential api (kind http): injected at the proxy toward api.test" in n
               for n in out.notes)
    host = spec_for(Effective(kind=SandboxKind.NAMESPACE, network=True,
                              credentials={"api": cred}))
    out = egress.extend_env(host, eff, KEY)
    assert "GH_TOKEN" not in out.env and any("not injected" in n for n in out.notes)


def test_a_container_gets_the_injection_and_kind_none_says_why_not() -> None:
    """Item 4: a container behind the proxy gets the bundle, the placeholders
    and a git helper answering the placeholder (its image has no `lev`);
    kind none keeps the old way and its note says why."""
    import subprocess

    from test_sandbox_spec import spec_for

    from leviathd.config.merge import Effective
    from leviathd.config.models import CredentialConfig, SandboxKind
    from leviathd.creds.service import CredentialService
    from leviathd.proxy import egress
    from leviathd.sandbox.spec import Mount

    creds = {"g": CredentialConfig(kind="git", hosts=["git.test"], secret_file="/etc/x"),
             "api": CredentialConfig(kind="http", hosts=["api.test"], token_env="GH_TOKEN",
                                     secret_file="/etc/y")}
    eff = Effective(kind=SandboxKind.CONTAINER, credentials=creds)
    spec = spec_for(eff)
    spec = type(spec)(**{**spec.__dict__, "kind": "container", "proxy": True, "mounts": (
        *spec.mounts, Mount("bind", "/run/leviath", "/run/leviath/agents/x", readonly=True,
                            why="broker"))})
    assert egress.applies(spec)
    # No "not offered" note from the credential helper's side for what is injected.
    assert CredentialService.extend_effective(None, spec, eff) is spec  # type: ignore[arg-type]
    out = egress.extend_env(spec, eff, KEY)
    assert out.env["GH_TOKEN"] == inject.placeholder(KEY, "api")
    assert all(out.env[v] == "/run/leviath/ca-bundle.pem" for v in egress.TRUST_VARIABLES)
    assert any(n.startswith("credential g (kind git): injected at the proxy toward git.test")
               for n in out.notes), out.notes
    env = {k: v for k, v in out.env.items() if k.startswith("GIT_CONFIG_")}
    fill = subprocess.run(["git", "credential", "fill"], input="url=https://git.test/r\n\n",
                          env={**env, "PATH": "/usr/bin:/bin", "HOME": "/nonexistent",
                               "GIT_TERMINAL_PROMPT": "0"},
                          capture_output=True, text=True, check=True).stdout
    assert f"password={inject.placeholder(KEY, 'g')}" in fill, fill
    # Kind none: git through the loopback port (its files at the host's path
    # of the agent's folder), the http token not offered, and what it cannot promise.
    none = spec_for(Effective(kind=SandboxKind.NONE, credentials=creds))
    assert egress.applies_direct(none)
    out = egress.extend_env(none, eff, KEY)
    assert "GH_TOKEN" not in out.env
    folder = egress.folder(none)
    assert folder.endswith(f"/agents/{none.execution_id}"), folder
    assert all(out.env[v] == f"{folder}/ca-bundle.pem" for v in egress.TRUST_VARIABLES)
    assert f"{folder}/egress.gitconfig" in out.env.values(), out.env
    assert any(n.startswith("credential g (kind git): injected at the proxy toward git.test")
               and "kind none" in n for n in out.notes), out.notes
    assert any(n.startswith("credential api (kind http): not injected at the egress (kind none")
               for n in out.notes), out.notes
    assert egress.NONE_LIMITS in out.notes


def test_a_cli_credential_with_hosts_runs_inside_with_no_wrapper() -> None:
    from leviathd.config.models import CredentialConfig
    from leviathd.creds.service import programs
    from leviathd.proxy import egress

    creds = {"gh": CredentialConfig(kind="cli", command=["gh"], token_env="GH_TOKEN",
                                    hosts=["api.github.com"], secret_file="/etc/x"),
             "glab": CredentialConfig(kind="cli", command=["glab"], token_env="GITLAB_TOKEN",
                                      secret_file="/etc/y")}
    assert egress.inside(creds) == {"gh"}
    assert set(programs(creds, egress.inside(creds))) == {"glab"}
    assert set(programs(creds)) == {"gh", "glab"}  # not behind the proxy: the wrappers
    (inj,) = egress.injections(creds, KEY)
    assert inj.kind == "cli" and inj.hosts == ("api.github.com",)


def test_an_ssh_origin_is_rewritten_to_https_and_pushes_stay_on_ssh_without_push_access(
        ) -> None:
    from leviathd.config.models import CredentialConfig
    from leviathd.proxy import egress

    read = CredentialConfig(kind="git", hosts=["github.com", "*.corp.test", "git.test:8443"],
                            secret_file="/etc/x")
    pairs = egress.ssh_rewrites({"r": read})
    assert ("url.https://github.com/.insteadOf", "git@github.com:") in pairs
    assert ("url.https://github.com/.insteadOf", "ssh://git@github.com/") in pairs
    assert ("url.git@github.com:.pushInsteadOf", "git@github.com:") in pairs
    assert not any("corp.test" in k or "8443" in k for k, _ in pairs)
    push = CredentialConfig(kind="git", hosts=["github.com"], access=["fetch", "push"],
                            secret_file="/etc/x")
    assert not any("pushInsteadOf" in k for k, _ in egress.ssh_rewrites({"p": push}))


def test_git_settings_of_several_parts_are_appended_not_overwritten() -> None:
    from leviathd.sandbox import gitenv

    env = gitenv.append({"GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_0": "http.proxy",
                         "GIT_CONFIG_VALUE_0": "p", "GIT_CONFIG_KEY_1": "core.sshCommand",
                         "GIT_CONFIG_VALUE_1": "s"}, [("credential.helper", "h")])
    assert env["GIT_CONFIG_COUNT"] == "3" and env["GIT_CONFIG_KEY_0"] == "http.proxy"
    assert env["GIT_CONFIG_KEY_2"] == "credential.helper"


def test_an_ip_literal_is_never_intercepted() -> None:
    inj = injection(hosts=("10.0.0.5", "api.example.com"))
    ca = AgentCA("0123abcd", inj.hosts)

    async def secret(_n: str) -> str:
        return SECRET

    injector = Injector(ca=ca, injections=(inj,), secret=secret)
    assert injector.covering("10.0.0.5", 443) == []
    assert injector.covering("api.example.com", 443) == [inj]
    with pytest.raises(ValueError):
        ca.leaf_context("10.0.0.5")
    with pytest.raises(ValueError):
        ca.leaf_context("other.example.com")


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> None:
    """A TLS handshake in memory: raises what the client's check raises."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    cli = client.wrap_bio(c_in, c_out, server_hostname=name)
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side, out_bio, peer_in in ((cli, c_out, s_in), (srv, s_out, c_in)):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
            peer_in.write(out_bio.read())
        try:
            cli.do_handshake()
            return
        except ssl.SSLWantReadError:
            continue


def test_the_agents_ca_vouches_for_its_covered_names_only(tmp_path: Path) -> None:
    """The name constraint: even a leaf the CA's key signed for another name
    (the proxy never makes one) does not verify in the sandbox."""
    ca = AgentCA("0123abcd", ("api.example.com",))
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    _handshake(ca.leaf_context("api.example.com"), client, "api.example.com")
    key, leaf = _cert("evil.test", ca._key, ca.cert.subject)
    forged = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    forged.load_cert_chain(_pem(tmp_path / "forged.pem", key, leaf))
    with pytest.raises(ssl.SSLCertVerificationError, match="permitted subtree violation"):
        _handshake(forged, client, "evil.test")
