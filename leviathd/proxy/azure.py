"""kind = "azure" at the egress (issue 30 item 5): a service principal whose
client secret, and every token obtained with it, stay in the daemon.

- The sandbox gets AZURE_TENANT_ID, AZURE_CLIENT_ID and, in
  AZURE_CLIENT_SECRET, a placeholder (random per agent), and an `az` first
  on its PATH that signs in with them before the first command that needs
  an account (`login_script`), then runs the real `az` in the agent's own
  fence.
- The authority host (`authority`, login.microsoftonline.com by default) is
  intercepted like a covered host, but nothing is ever injected there: a
  client-credentials request for the credential's tenant that carries the
  placeholder is answered by the daemon itself (`AzureEgress.answer`) with a
  placeholder access token; any other login to that tenant's token endpoint
  is refused (the secret placeholder is never sent on), every other request
  on the host goes on untouched (its metadata, other tenants).
- Toward the covered management hosts (`hosts`, Azure Resource Manager by
  default) the proxy swaps that placeholder in `Authorization: Bearer` for a
  real token (proxy/inject.py, as kind "http"), which the daemon obtained
  itself (`AzureEgress.token`): the client-credentials flow against the
  authority, over TLS verified against the system's CAs, to an address the
  agent's proxy settings allow, the answer bounded, the token cached per
  agent and credential until shortly before it expires.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import socket
import ssl
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from leviathd.http import body as http_body
from leviathd.http import write
from leviathd.http.grammar import BadMessage
from leviathd.proxy import inject, policy, resolve

# The authority's Injection: intercepted for the daemon's answer, never injected.
LOGIN_KIND = "azure-login"
MAX_BODY = 16384  # an agent's token request
MAX_RESPONSE = 65536  # the authority's answer to the daemon
TIMEOUT = 30.0
# A cached token is used until this long before it expires.
MARGIN = 300
# The lifetime the agent is told for its placeholder token: it asks again
# (the daemon answers, nothing leaves) rather than keep a stale one.
PLACEHOLDER_LIFETIME = 3599


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token_placeholder(key: bytes, name: str, *, tenant: str, client_id: str) -> str:
    """The agent's access token: JWT-shaped (tools that read the claims find
    its tenant and app), unsigned, its last part the placeholder that means
    something only to this agent's proxy."""
    mark = inject.PLACEHOLDER_PREFIX + hmac.new(key, f"{name}\0token".encode(),
                                                hashlib.sha256).hexdigest()[:40]
    header = _b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    claims = _b64(json.dumps({"aud": "https://management.azure.com/", "tid": tenant,
                              "appid": client_id, "iss": "leviathd-placeholder",
                              "exp": 4102444800}, sort_keys=True).encode())
    return f"{header}.{claims}.{mark}"


def injections(name: str, *, hosts: Sequence[str], authority: str, tenant: str,
               client_id: str, key: bytes) -> tuple[inject.Injection, inject.Injection]:
    """The management hosts' (the bearer token put in where the placeholder
    token was) and the authority's (intercepted, answered, nothing put in)."""
    manage = inject.Injection(name=name, kind="azure", hosts=tuple(hosts),
                              placeholder=token_placeholder(key, name, tenant=tenant,
                                                            client_id=client_id),
                              header="Authorization", value="Bearer {secret}")
    # The authority's entry carries the app in `username` and the tenant in
    # `access` (Injection's fields, so the proxy's snapshot keeps them as is).
    login = inject.Injection(name=name, kind=LOGIN_KIND, hosts=(authority.lower(),),
                             placeholder=inject.placeholder(key, name), header="",
                             value="", username=client_id, access=(tenant,))
    return manage, login


def env(*, tenant: str, client_id: str, authority: str, secret_placeholder: str
        ) -> dict[str, str]:
    """What the Azure SDKs' environment credential and the `az` wrapper read;
    the secret is the placeholder (worthless outside this agent's proxy)."""
    out = {"AZURE_TENANT_ID": tenant, "AZURE_CLIENT_ID": client_id,
           "AZURE_CLIENT_SECRET": secret_placeholder,
           # az's telemetry is a process of its own sending to a host of its own.
           "AZURE_CORE_COLLECT_TELEMETRY": "no"}
    if authority != "login.microsoftonline.com":
        out["AZURE_AUTHORITY_HOST"] = f"https://{authority}"
    return out


def login_script(own_dir: str) -> bytes:
    """`az` first on the sandbox's PATH: the Legato spec's wrapper, which
    "signs in as the credential's app before the first command that needs
    an account". It holds nothing: the sign-in is the real az's, in the
    agent's fence, with the placeholder secret; the daemon answers it."""
    return f"""#!/bin/sh
# leviathd: az signs in as the credential's service principal (a placeholder
# login: the real secret and tokens stay in leviathd) before its first use.
own={own_dir}
real=
old_ifs=$IFS
IFS=:
for d in $PATH; do
    [ "$d" = "$own" ] && continue
    if [ -x "$d/az" ]; then real="$d/az"; break; fi
done
IFS=$old_ifs
if [ -z "$real" ]; then
    echo "az: not installed (leviathd's sign-in wrapper found no other az on PATH)" >&2
    exit 127
fi
case "${{1:-}}" in
    ""|login|logout|version|--version|-h|--help|cloud|config|extension) ;;
    *)
        if ! grep -qs -- "$AZURE_CLIENT_ID" "${{AZURE_CONFIG_DIR:-$HOME/.azure}}/azureProfile.json"
        then
            "$real" login --service-principal --username "$AZURE_CLIENT_ID" \\
                --password "$AZURE_CLIENT_SECRET" --tenant "$AZURE_TENANT_ID" \\
                --allow-no-subscriptions --output none || exit $?
        fi
        ;;
esac
exec "$real" "$@"
""".encode()


# -- the agent's sign-in, answered here ---------------------------------------


def _token_path(path: str, tenant: str) -> bool:
    bare = urllib.parse.unquote(path.partition("?")[0]).lower()
    return bare in (f"/{tenant.lower()}/oauth2/v2.0/token", f"/{tenant.lower()}/oauth2/token")


def local_answer(login: inject.Injection, manage: inject.Injection, req: inject.Request,
                 body: bytes) -> bytes:
    """The daemon's answer to the agent's token request (pure): the
    placeholder token when the request is the client-credentials grant of
    this credential's app with its placeholder; a refusal otherwise."""
    try:
        form = urllib.parse.parse_qs(body.decode("utf-8"), strict_parsing=True,
                                     max_num_fields=32)
    except (UnicodeDecodeError, ValueError):
        raise inject.Refusal(400, "not a form-encoded token request") from None

    def one(field: str) -> str:
        values = form.get(field, [])
        return values[0] if len(values) == 1 else ""

    if one("client_secret") != login.placeholder or one("client_id") != login.username:
        raise inject.Refusal(403, f"the token endpoint of tenant {login.access[0]} is answered "
                                  f"by leviathd for credential {login.name!r}: sign in as "
                                  "its app with the placeholder in AZURE_CLIENT_SECRET; no "
                                  "other sign-in to this tenant is sent on")
    if one("grant_type") != "client_credentials":
        raise inject.Refusal(400, "only the client-credentials grant is answered")
    data = json.dumps({"token_type": "Bearer", "expires_in": PLACEHOLDER_LIFETIME,
                       "ext_expires_in": PLACEHOLDER_LIFETIME,
                       "access_token": manage.placeholder}).encode()
    return write.answer(200, "OK", "application/json; charset=utf-8", data,
                        [("Cache-Control", "no-store")])


async def _read_body(reader: asyncio.StreamReader, req: inject.Request) -> bytes:
    length = req.header("content-length") or ""
    if not length.isdigit() or int(length) > MAX_BODY:
        raise inject.Refusal(411 if not length else 413,
                             f"a token request needs a body of known length, at most {MAX_BODY}")
    return await asyncio.wait_for(reader.readexactly(int(length)), TIMEOUT)


# -- the daemon's own client-credentials flow ---------------------------------


@dataclass(frozen=True)
class Principal:
    """What the daemon signs in with (the secret read when needed)."""

    tenant: str
    client_id: str
    authority: str
    scope: str


# Opens a TCP connection to host:port at an address the agent's proxy allows.
Connect = Callable[[str, int], Awaitable[socket.socket]]
ReadSecret = Callable[[str], Awaitable[str]]


def checked_connect(settings: policy.ProxySettings, *, uid: int, agent: str) -> Connect:
    """The daemon's own connection to the authority goes only where the
    agent's proxy would let the agent go (no loopback, no private range the
    settings do not open): a config naming an inside host gets nothing from
    root that its user could not reach."""
    async def connect(host: str, port: int) -> socket.socket:
        try:
            addrs = await resolve.shared().resolve(host, port, uid=uid, agent=agent)
        except resolve.ResolveError as exc:
            raise ValueError(f"cannot resolve the authority {host}: {exc}") from None
        why = policy.check_addresses(addrs, allow_private=settings.allow_private,
                                     private_ranges=settings.private_ranges)
        if why is not None or not addrs:
            raise ValueError(f"refusing the authority {host}: {why or 'no address'}")
        loop = asyncio.get_running_loop()
        last: Exception | None = None
        for ip in addrs:
            sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET,
                                 socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            sock.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(sock, (ip, port)), TIMEOUT)
                return sock
            except (OSError, TimeoutError) as exc:
                sock.close()
                last = exc
            except BaseException:
                sock.close()
                raise
        raise OSError(f"cannot connect to the authority {host}:{port}: {last}")
    return connect


def _split(authority: str) -> tuple[str, int]:
    host, _, port = authority.partition(":")
    return host.lower(), int(port) if port else 443


def _parse_response(raw: bytes) -> tuple[int, bytes]:
    try:
        head, body = http_body.whole_response(raw, "POST")
    except BadMessage as exc:
        raise ValueError(f"the authority's answer is not HTTP/1.x: {exc}") from None
    return head.status, body


def _scrub(text: str, secret: str) -> str:
    return text.replace(secret, "[secret]") if secret else text


async def fetch_token(p: Principal, secret: str, *, connect: Connect,
                      upstream: ssl.SSLContext) -> tuple[str, float]:
    """(access token, seconds it lives). Raises OSError (TLS included) or
    ValueError with a reason that never holds the secret."""
    host, port = _split(p.authority)
    sock = await connect(host, port)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            sock=sock, ssl=upstream, server_hostname=host, limit=MAX_RESPONSE), TIMEOUT)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise ValueError(f"the authority {host}'s certificate does not verify: "
                         f"{exc.verify_message}") from None
    except BaseException:
        sock.close()
        raise
    try:
        body = urllib.parse.urlencode({"grant_type": "client_credentials",
                                       "client_id": p.client_id, "client_secret": secret,
                                       "scope": p.scope}).encode()
        where = host if port == 443 else f"{host}:{port}"
        path = f"/{urllib.parse.quote(p.tenant)}/oauth2/v2.0/token"
        writer.write(write.request("POST", path, [
            ("Host", where), ("Accept", "application/json"),
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Content-Length", str(len(body))), ("Connection", "close")]) + body)
        await writer.drain()
        raw = b""
        while len(raw) <= MAX_RESPONSE:
            more = await asyncio.wait_for(reader.read(MAX_RESPONSE + 1 - len(raw)), TIMEOUT)
            if not more:
                break
            raw += more
        if len(raw) > MAX_RESPONSE:
            raise ValueError(f"the authority's answer is over {MAX_RESPONSE} bytes")
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, asyncio.TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), 5)
    status, data = _parse_response(raw)
    try:
        answer = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        answer = None
    if not isinstance(answer, dict):
        raise ValueError(f"the authority answered {status} without a JSON object")
    if status != 200 or not isinstance(answer.get("access_token"), str):
        error = str(answer.get("error", ""))[:64]
        detail = _scrub(str(answer.get("error_description", "")), secret)
        raise ValueError(_scrub(f"the authority refused the sign-in ({status} {error}): "
                                f"{detail.splitlines()[0] if detail else ''}"[:300], secret))
    try:
        lifetime = float(answer.get("expires_in", 0))
    except (TypeError, ValueError):
        lifetime = 0.0
    return inject.check_secret(str(answer["access_token"])), lifetime


@dataclass
class AzureEgress:
    """One agent's azure credentials at its proxy: the answers to its
    sign-ins and the cache of the daemon's own tokens."""

    logins: Mapping[str, inject.Injection]  # by name: the authority's
    manages: Mapping[str, inject.Injection]  # by name: the management hosts'
    principal: Callable[[str], Principal]
    secret: ReadSecret  # the client secret (the broker's reader)
    connect: Connect
    upstream: ssl.SSLContext
    now: Callable[[], float] = time.monotonic
    _tokens: dict[str, tuple[str, float]] = field(default_factory=dict)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    @classmethod
    def of(cls, all_injections: Sequence[inject.Injection], **kw: object) -> AzureEgress | None:
        logins = {i.name: i for i in all_injections if i.kind == LOGIN_KIND}
        manages = {i.name: i for i in all_injections if i.kind == "azure"}
        if not logins:
            return None
        return cls(logins=logins, manages=manages, **kw)  # type: ignore[arg-type]

    async def answer(self, host: str, port: int, req: inject.Request,
                     reader: asyncio.StreamReader) -> tuple[bytes, str] | None:
        """On an authority host: (the answer, the credential's name) to a
        token request of a covered tenant; None for anything else (it goes on
        untouched)."""
        if req.method != "POST":
            return None
        for login in sorted(self.logins.values(), key=lambda i: i.name):
            if inject.covers(login, host, port) and _token_path(req.path, login.access[0]):
                body = await _read_body(reader, req)
                return local_answer(login, self.manages[login.name], req, body), login.name
        return None

    async def read(self, name: str) -> str:
        """The bearer token for credential `name` (the proxy's secret for
        the management hosts): cached, or fetched now, one fetch at a time."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            cached = self._tokens.get(name)
            if cached is not None and cached[1] > self.now():
                return cached[0]
            secret = inject.check_secret(await self.secret(name))
            p = self.principal(name)
            try:
                token, lifetime = await fetch_token(p, secret, connect=self.connect,
                                                    upstream=self.upstream)
            except TimeoutError:
                raise ValueError(f"the authority {p.authority} did not answer within "
                                 f"{TIMEOUT:.0f} s") from None
            if lifetime > MARGIN:
                self._tokens[name] = (token, self.now() + lifetime - MARGIN)
            return token

    def wrap(self, secret: ReadSecret) -> ReadSecret:
        """The proxy's secret reader: tokens for azure credentials, the
        secret itself for the others."""
        async def read(name: str) -> str:
            if name in self.manages:
                return await self.read(name)
            return await secret(name)
        return read
