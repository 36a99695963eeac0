"""Which requests get a credential at the egress, and how (issue 30): pure.

The sandbox holds a placeholder per credential (random per agent, derived
from a key only the daemon has); the proxy, having terminated TLS for a
covered host (proxy/tls.py), rebuilds the request head: the credential's
header is dropped from what the agent sent and set anew with the secret,
when the agent's own value carried the placeholder or none was sent. A
header the agent sent with anything else is left as the agent's (it is not
ours to replace) and the placeholder never leaves in any other header: a
head naming it elsewhere is refused, so no echo of another header gives it
back the secret. Bodies are never touched.

kind = "git": `Authorization: Basic base64(username:placeholder)` (what
git's credential helper gave) becomes the same with the token; a push
(`git-receive-pack`) is only injected for a credential with access push.
kind = "http": `header` set to `value` with `{secret}` replaced, or basic
auth with `username` when `value = "basic"`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

PLACEHOLDER_PREFIX = "leviath-placeholder-"
# Kinds whose hosts are intercepted but get no secret (proxy/azure.py: the
# authority, whose sign-in the daemon answers itself).
INTERCEPT_ONLY = ("azure-login",)
MAX_SECRET = 8192


@dataclass(frozen=True)
class Injection:
    """One credential as the proxy applies it."""

    name: str
    kind: str  # "git" | "http" | "cli" | "azure" | "azure-login"
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
    path: str
    headers: list[tuple[str, str]]  # (name as sent, value)

    def header(self, name: str) -> str | None:
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), None)

    @property
    def push(self) -> bool:
        """A git push: the receive-pack service (its discovery or its POST)."""
        path, _, query = self.path.partition("?")
        return path.endswith("/git-receive-pack") or "service=git-receive-pack" in query


def parse_head(raw: bytes) -> Request:
    """An HTTP/1.x request head (the bytes up to and without the blank line)."""
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes anything
        raise Refusal(400, "not an HTTP request") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        raise Refusal(400, "not an HTTP/1.x request in origin form")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or any(c in name for c in " \t"):
            raise Refusal(400, "a malformed header line")
        headers.append((name, value.strip()))
    return Request(parts[0], parts[1], headers)


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


def credential_value(inj: Injection, secret: str) -> str:
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
                   "host"):
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
        if any(k.lower() == inj.header.lower() for k, _ in out):
            continue  # a second credential for the same header: the first (by name) wins
        out.append((inj.header, credential_value(inj, secret)))
        used.append(inj.name)
    out.insert(0, ("Host", host))
    lines = [f"{req.method} {req.path} HTTP/1.1", *(f"{k}: {v}" for k, v in out),
             "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), used


MAX_CHUNK_LINE = 4096


def body_length(req: Request) -> int | None:
    """How long the request's body is: its Content-Length, 0 with neither
    header, None for chunked. What the agent sends after that body (a second,
    pipelined request: no head of ours, no audit record, no push approval)
    is never forwarded; framing two parties could read differently (both
    headers, two lengths, another coding) is refused."""
    lengths = [v for k, v in req.headers if k.lower() == "content-length"]
    codings = [v for k, v in req.headers if k.lower() == "transfer-encoding"]
    if codings:
        if lengths or len(codings) > 1 or codings[0].strip().lower() != "chunked":
            raise Refusal(400, "a request body framed other than by one Content-Length or "
                               "Transfer-Encoding: chunked alone")
        return None
    if not lengths:
        return 0
    if len(set(lengths)) > 1 or not lengths[0].isdigit() or len(lengths[0]) > 18:
        raise Refusal(400, "a bad or repeated Content-Length")
    return int(lengths[0])


class Body:
    """Follows the body of one request as its bytes come: `take` returns the
    part of `data` that is still body, and whether the body has ended."""

    def __init__(self, length: int | None) -> None:
        self.chunked = length is None
        self.left = length or 0
        self.done = length == 0
        self._state = "size"
        self._line = b""

    def take(self, data: bytes) -> tuple[bytes, bool]:
        if self.done:
            return b"", True
        if not self.chunked:
            n = min(self.left, len(data))
            self.left -= n
            self.done = self.left == 0
            return data[:n], self.done
        i = 0
        while i < len(data) and not self.done:
            if self._state == "data":
                n = min(self.left, len(data) - i)
                self.left -= n
                i += n
                if self.left == 0:
                    self._state = "size"
                continue
            j = data.find(b"\n", i)
            if j < 0:
                self._line += data[i:]
                i = len(data)
                if len(self._line) > MAX_CHUNK_LINE:
                    raise ValueError("a chunk line too long")
                break
            line = (self._line + data[i:j]).rstrip(b"\r")
            self._line = b""
            i = j + 1
            if len(line) > MAX_CHUNK_LINE:
                raise ValueError("a chunk line too long")
            if self._state == "size":
                size = int(line.split(b";", 1)[0].strip() or b"x", 16)
                if size < 0:
                    raise ValueError("a bad chunk size")
                if size == 0:
                    self._state = "trailer"
                else:
                    self._state, self.left = "data", size + 2  # its data and CRLF
            elif not line:
                self.done = True
        return data[:i], self.done


def check_secret(secret: str) -> str:
    """A secret goes into a header line: no line break, NUL, or overlong value."""
    secret = secret.strip("\n")
    if not secret or len(secret) > MAX_SECRET or any(c in secret for c in "\r\n\0"):
        raise ValueError("the credential's secret is empty, too long or holds a line break")
    return secret
