"""Which requests get a credential at the egress, and how (issue 30): pure.

The sandbox holds a placeholder per credential (random per agent, derived
from a key only the daemon has); the proxy, having terminated TLS for a
covered host (proxy/tls.py), rebuilds the request head: the credential's
header is dropped from what the agent sent and set anew with the secret,
when the agent's own value carried the placeholder or none was sent. A
header the agent sent with anything else is left as the agent's (it is not
ours to replace) and the placeholder never leaves in any other header: a
head naming it elsewhere is refused, so no echo of another header gives it
back the secret. The head sent on is written by the one HTTP layer
(leviathd/http/) from what it parsed, never copied; bodies are decoded and
framed anew, their content untouched.

kind = "git": `Authorization: Basic base64(username:placeholder)` (what
git's credential helper gave) becomes the same with the token. Only a
request proven to be a fetch (`Request.fetch`) goes without a person; any
other request toward the host gets the token only for a credential with
access push, and (but for the ref advertisement) after a person approved it
(proxy/tls.py).
kind = "http": `header` set to `value` with `{secret}` replaced, or basic
auth with `username` when `value = "basic"`.
kind = "registry" (a user's container registry login, proxy/registries.py):
`Authorization: Basic base64(user:password)`, into a request that sent no
Authorization of its own and is a registry read (`Request.registry_read`).
kind = "login" (an agent CLI's own login, proxy/logins.py): as "http", but
only in place of its placeholder, never into a request that sent none (a
login has several secrets for one header, and a provider may refuse two
kinds of key in one request).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from leviathd.http import body, message, target, write
from leviathd.http.grammar import BadMessage
from leviathd.http.message import Framing, Head

PLACEHOLDER_PREFIX = "leviath-placeholder-"
# Kinds whose hosts are intercepted but get no secret (proxy/azure.py: the
# authority, whose sign-in the daemon answers itself; proxy/refresh.py: a
# CLI login's token endpoint, whose refresh the daemon answers itself).
INTERCEPT_ONLY = ("azure-login", "login-refresh")
MAX_SECRET = 8192


@dataclass(frozen=True)
class Injection:
    """One credential as the proxy applies it."""

    name: str
    # "git" | "http" | "cli" | "azure" | "azure-login" | "login" | "login-refresh" | "registry"
    kind: str
    hosts: tuple[str, ...]
    placeholder: str
    header: str = "Authorization"
    value: str = "Bearer {secret}"
    username: str = "x-access-token"
    access: tuple[str, ...] = ("fetch",)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "hosts": list(self.hosts),
                "placeholder": self.placeholder, "header": self.header, "value": self.value,
                "username": self.username, "access": list(self.access)}

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Injection:
        def strs(v: object) -> tuple[str, ...]:
            return tuple(str(x) for x in v) if isinstance(v, list) else ()

        return cls(name=str(d["name"]), kind=str(d["kind"]), hosts=strs(d.get("hosts")),
                   placeholder=str(d["placeholder"]), header=str(d.get("header", "Authorization")),
                   value=str(d.get("value", "Bearer {secret}")),
                   username=str(d.get("username", "x-access-token")),
                   access=strs(d.get("access")) or ("fetch",))


def placeholder(key: bytes, name: str) -> str:
    """The agent's stand-in for credential `name`: it means nothing outside
    this agent's proxy and tells nothing of the secret."""
    return PLACEHOLDER_PREFIX + hmac.new(key, name.encode(), hashlib.sha256).hexdigest()[:40]


def covers(inj: Injection, host: str, port: int) -> bool:
    """A pattern with a port covers that port; one without, 443."""
    for pattern in inj.hosts:
        name, _, want = pattern.partition(":")
        if (int(want) if want else 443) == port and fnmatchcase(host, name):
            return True
    return False


def covering(injections: Iterable[Injection], host: str, port: int) -> list[Injection]:
    return sorted((i for i in injections if covers(i, host, port)), key=lambda i: i.name)


class Refusal(Exception):
    """The request is answered by the proxy (status, reason); nothing is sent."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # the target in origin form, normalised (http/target.py)
    headers: list[tuple[str, str]]  # (name as sent, value), in RFC 9110's bytes

    def header(self, name: str) -> str | None:
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), None)

    @property
    def fetch(self) -> bool:
        """Proven a git fetch (issue 44): the discovery of git-upload-pack or
        a POST to it with its content type, spelt as git spells them (no
        escape, `;param`, dot segment, doubled or trailing "/" in the path
        or other case). Anything else toward a git credential's host is
        taken for a push."""
        path, _, query = self.path.partition("?")
        if any(c in path for c in "%;\\") or "//" in path or "/./" in path or "/../" in path:
            return False
        if self.method == "GET":
            return path.endswith("/info/refs") and query == "service=git-upload-pack"
        return (self.method == "POST" and path.endswith("/git-upload-pack") and not query
                and self.header("content-type") == "application/x-git-upload-pack-request")

    @property
    def push(self) -> bool:
        return not self.fetch

    @property
    def registry_read(self) -> bool:
        """A container registry read (a pull): GET or HEAD, and every token
        scope it asks for (`scope=repository:NAME:pull`, the token realm's
        query, several joined by spaces) only pulls. Anything else toward a
        registry login's host (a blob upload, a manifest PUT or DELETE, a
        token with push or `*` rights, an OAuth POST) gets no login: the
        user's login never writes to her registry for an agent (red team of
        issue 49 item 3: the agent's own curl through its proxy pushed)."""
        if self.method not in ("GET", "HEAD"):
            return False
        _, _, query = self.path.partition("?")
        try:
            fields = urllib.parse.parse_qsl(query, keep_blank_values=True,
                                            strict_parsing=bool(query), max_num_fields=64)
        except ValueError:
            return False
        for key, value in fields:
            if key.lower() != "scope":
                continue
            for scope in value.split():
                kind, _, rest = scope.partition(":")
                name, _, actions = rest.rpartition(":")
                if kind != "repository" or not name or actions != "pull":
                    return False
        return True

    @property
    def receive_pack(self) -> bool:
        """A POST a server may route to receive-pack, by any spelling: its
        body is read for the ref updates and push options to approve."""
        return self.method == "POST" and target.decoded_path(self.path).endswith(
            "/git-receive-pack")

    @property
    def push_discovery(self) -> bool:
        """`GET info/refs?service=git-receive-pack`, as git spells it: the
        ref advertisement before a push, which changes nothing (it needs
        access push, not a person)."""
        path, _, query = self.path.partition("?")
        return (self.method == "GET" and path.endswith("/info/refs") and "%" not in path
                and ";" not in path and query == "service=git-receive-pack")


def read_request(raw: bytes) -> tuple[Request, body.Decoder, Framing]:
    """A request head up to and with its blank line (the one HTTP layer,
    leviathd/http/): the request, the decoder of its body, its framing."""
    try:
        head, conn = message.parse_request(raw, need_host=False)
        path = target.origin_form(head.target)
        framing = head.framing()
    except BadMessage as exc:
        raise Refusal(exc.status, f"a malformed request: {exc}") from None
    return Request(head.method, path, list(head.headers)), body.Decoder(conn), framing


def parse_head(raw: bytes) -> Request:
    """An HTTP/1.x request head (the bytes up to and without the blank line)."""
    return read_request(raw + b"\r\n\r\n")[0]


def applying(injections: Iterable[Injection], req: Request) -> list[Injection]:
    """The credentials `req` may carry: an intercept-only entry (the azure
    authority's) none, a git credential only a proven fetch unless its
    `access` includes push, a registry login only a registry read."""
    return [i for i in injections if i.kind not in INTERCEPT_ONLY
            and (i.kind != "git" or req.fetch or "push" in i.access)
            and (i.kind != "registry" or req.registry_read)]


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _carries(value: str, ph: str) -> bool:
    if ph in value:
        return True
    scheme, _, rest = value.partition(" ")
    if scheme.lower() == "basic":
        try:
            return ph in base64.b64decode(rest.strip(), validate=True).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            return False
    return False


def carried(req: Request, inj: Injection) -> bool:
    """Whether the request's header for `inj` holds its placeholder."""
    value = req.header(inj.header)
    return bool(value) and _carries(value or "", inj.placeholder)


def credential_value(inj: Injection, secret: str) -> str:
    if inj.kind == "registry":  # the secret is `user:password` (proxy/registries.py)
        return "Basic " + base64.b64encode(secret.encode()).decode()
    if inj.kind == "git" or inj.value == "basic":
        return _basic(inj.username, secret)
    return inj.value.replace("{secret}", secret)


def rebuild(req: Request, injections: Sequence[Injection], secrets: Mapping[str, str],
            *, host: str) -> tuple[bytes, list[str]]:
    """The head to send upstream (with `Connection: close`, one request per
    connection) and the names of the credentials put in. `secrets` holds
    the secret of each injection that applies (the caller read them);
    `host` is host[:port] as the Host header must name it."""
    placeholders = {i.placeholder: i for i in injections}
    used: list[str] = []
    out: list[tuple[str, str]] = []
    owned = {i.header.lower() for i in injections if i.name in secrets}
    for name, value in req.headers:
        low = name.lower()
        if low in ("connection", "proxy-connection", "keep-alive", "proxy-authorization",
                   "host", "accept-encoding", "te"):
            # Accept-Encoding is ours too: `identity`, so that the answer
            # comes in plain bytes the mask can read (proxy/mask.py).
            # Host is ours: the covered host the connection was verified to
            # be, never a name of the agent's on the same front (fronting).
            continue
        carried = [p for p in placeholders if _carries(value, p)]
        if low in owned and (carried or not value):
            continue  # replaced below
        if carried:
            raise Refusal(403, f"the placeholder of credential {placeholders[carried[0]].name!r} "
                               f"is only exchanged in its {placeholders[carried[0]].header} "
                               "header")
        out.append((name, value))
    for inj in injections:
        secret = secrets.get(inj.name)
        if secret is None:
            continue
        agent_value = req.header(inj.header)
        if agent_value and not _carries(agent_value, inj.placeholder):
            continue  # the agent's own header, kept above
        if inj.kind == "login" and not agent_value:
            continue  # a login's secret only where its placeholder was
        if any(k.lower() == inj.header.lower() for k, _ in out):
            continue  # a second credential for the same header: the first (by name) wins
        out.append((inj.header, credential_value(inj, secret)))
        used.append(inj.name)
    out.insert(0, ("Host", host))
    out.append(("Accept-Encoding", "identity"))
    out.append(("Connection", "close"))
    try:
        return write.request(req.method, req.path, out), used
    except BadMessage as exc:
        raise Refusal(400, f"a request that cannot be written: {exc}") from None


def body_length(req: Request) -> int | None:
    """How long the request's body is: its Content-Length, 0 with neither
    header, None for chunked; framing two parties could read differently
    (both headers, two lengths, another coding) is refused."""
    try:
        framing = Head(tuple(req.headers)).framing()
    except BadMessage as exc:
        raise Refusal(400, str(exc)) from None
    return None if framing.kind == "chunked" else framing.length


def check_secret(secret: str) -> str:
    """A secret goes into a header line: no line break, NUL, or overlong value."""
    secret = secret.strip("\n")
    if not secret or len(secret) > MAX_SECRET or any(c in secret for c in "\r\n\0"):
        raise ValueError("the credential's secret is empty, too long or holds a line break")
    return secret
