"""The agent CLI's own token refresh, answered by the daemon (issue 45 item 1).

Inside an agent the CLI holds placeholders only (proxy/logins.py); when its
access token expires it posts its refresh token, in the request's BODY, to
the provider's token endpoint. Bodies are never swapped, so the daemon
answers that request itself:

- the provider's token hosts are intercepted for the agent (an intercept-only
  injection, `KIND`, whose placeholder is the agent's refresh placeholder);
  a POST to the token path is read (its Content-Length at most MAX_BODY)
  and, when it is the refresh grant carrying exactly that placeholder, the
  daemon reads the REAL refresh token from the host's file as the user at
  that moment, refreshes it itself at the same provider host (over TLS
  verified against the system's CAs, to an address the agent's proxy
  settings allow, the answer bounded), writes the new tokens back to the
  host's file as the user (proxy/loginfiles.py `write_values`: by
  descriptor, in place so that the agents' binds over it stay, other keys
  and mode kept), and
  answers the CLI with the provider's JSON where the tokens are the agent's
  same placeholders (the injector reads the new real values from the file);
- any other request to the token path (another grant, another or a forged
  refresh token) is refused: nothing is sent on and nothing is written.
  Other paths on those hosts go on untouched (nothing is put in).

From the vendor's bundle (Claude Code 2.1.332): `TOKEN_URL`
https://platform.claude.com/v1/oauth/token, a JSON body
{grant_type: "refresh_token", refresh_token, client_id, scope}; the answer's
access_token, refresh_token (the old one kept when absent) and expires_in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from leviathd.http import body as http_body
from leviathd.http import write
from leviathd.http.grammar import BadMessage
from leviathd.proxy import inject
from leviathd.proxy import loginfiles as clilogins

KIND = "login-refresh"
MAX_BODY = 16384  # the CLI's refresh request
MAX_RESPONSE = 65536  # the provider's answer to the daemon
MAX_FIELD = 512
TIMEOUT = 30.0


@dataclass(frozen=True)
class Refresher:
    """Where one CLI refreshes, and where its tokens lie in its login file."""

    tool: str  # as clilogins.LOGIN_FILES names it
    slug: str  # as proxy/logins.py names its injections
    hosts: tuple[str, ...]
    path: str
    access: tuple[str, ...]
    refresh: tuple[str, ...]
    expires_ms: tuple[str, ...]  # epoch milliseconds
    scopes: tuple[str, ...]  # a list of strings


REFRESHERS: tuple[Refresher, ...] = (
    # console.anthropic.com: the endpoint of the CLI's earlier versions.
    Refresher("Claude Code", "claude-code", ("platform.claude.com", "console.anthropic.com"),
              "/v1/oauth/token", ("claudeAiOauth", "accessToken"),
              ("claudeAiOauth", "refreshToken"), ("claudeAiOauth", "expiresAt"),
              ("claudeAiOauth", "scopes")),
)

_FIELD = re.compile(r"^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$")
_SECRET_KEY = re.compile(r"token|key|secret|password", re.IGNORECASE)


def injection_name(tool_slug: str, path: Sequence[str]) -> str:
    """proxy/logins.py's name of the injection of the value at `path`."""
    return f"login/{tool_slug}/{'/'.join(path)}"


def refresh_injections(tool_slug: str, injections: Sequence[inject.Injection]
                       ) -> list[inject.Injection]:
    """The intercept-only entries for a login's token hosts: one per CLI
    that refreshes, its placeholder the agent's refresh placeholder."""
    out = []
    for r in REFRESHERS:
        if r.slug != tool_slug:
            continue
        ref = next((i for i in injections
                    if i.name == injection_name(tool_slug, r.refresh)), None)
        if ref is not None:
            out.append(inject.Injection(name=f"login/{tool_slug}/refresh", kind=KIND,
                                        hosts=r.hosts, placeholder=ref.placeholder))
    return out


def _field(value: object) -> str | None:
    return value if isinstance(value, str) and len(value) <= MAX_FIELD and _FIELD.match(
        value) else None


def checked_request(request: object, placeholder: str) -> dict[str, object]:
    """The daemon's own refresh request (pure) from the CLI's, without the
    refresh token: its client and scope kept when they are plain short
    strings. Raises Refusal when the CLI's is not the refresh grant with
    exactly this agent's placeholder."""
    if (not isinstance(request, dict) or request.get("grant_type") != "refresh_token"
            or request.get("refresh_token") != placeholder):
        raise inject.Refusal(403, "the token endpoint is answered by leviathd for the CLI's "
                                  "login: only a refresh with the agent's placeholder refresh "
                                  "token; nothing was sent on")
    out: dict[str, object] = {"grant_type": "refresh_token"}
    for key in ("client_id", "scope"):
        value = _field(request.get(key))
        if value is not None:
            out[key] = value
    expires = request.get("expires_in")
    if isinstance(expires, int) and not isinstance(expires, bool) and 0 < expires < 1 << 31:
        out["expires_in"] = expires
    return out


@dataclass(frozen=True)
class Refreshed:
    access: str
    refresh: str
    expires_in: float | None
    scope: str | None
    answer: dict[str, Any]  # the provider's JSON, for the agent's answer


def parse_answer(status: int, data: bytes, real_refresh: str) -> Refreshed:
    """The provider's answer (pure); ValueError without any secret in it."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        raise ValueError(f"the token endpoint answered {status} without a JSON object")
    if status != 200 or not isinstance(doc.get("access_token"), str):
        error = _field(doc.get("error")) or ""
        raise ValueError(f"the token endpoint refused the refresh ({status} {error[:64]})")
    access = inject.check_secret(doc["access_token"])
    new_refresh = doc.get("refresh_token")
    refresh = inject.check_secret(new_refresh) if isinstance(new_refresh, str) else real_refresh
    expires = doc.get("expires_in")
    expires_in = (float(expires) if isinstance(expires, (int, float))
                  and not isinstance(expires, bool) and 0 < expires < 1 << 31 else None)
    return Refreshed(access, refresh, expires_in, _field(doc.get("scope")), doc)


def _shown(value: Any, depth: int) -> Any:
    """The provider's JSON without a secret-named string at any depth."""
    if isinstance(value, dict) and depth < clilogins.MAX_DEPTH:
        return {k: _shown(v, depth + 1) for k, v in value.items()
                if not (isinstance(v, str) and _SECRET_KEY.search(k) and k != "token_type")}
    if isinstance(value, list) and depth < clilogins.MAX_DEPTH:
        return [_shown(v, depth + 1) for v in value]
    return value if not isinstance(value, (dict, list)) else None


def agent_answer(refreshed: Refreshed, access_ph: str, refresh_ph: str) -> bytes:
    """What the CLI gets (pure): the provider's JSON with the tokens the
    agent's placeholders, and any other secret-named string dropped."""
    shown = _shown(refreshed.answer, 0)
    shown["access_token"] = access_ph
    shown["refresh_token"] = refresh_ph
    return write.answer(200, "OK", "application/json", json.dumps(shown).encode(),
                        [("Cache-Control", "no-store")])


async def _read_body(reader: asyncio.StreamReader, req: inject.Request) -> bytes:
    length = req.header("content-length") or ""
    if not length.isdigit() or int(length) > MAX_BODY:
        raise inject.Refusal(411 if not length else 413,
                             f"a token request needs a body of known length, at most {MAX_BODY}")
    try:
        return await asyncio.wait_for(reader.readexactly(int(length)), TIMEOUT)
    except asyncio.IncompleteReadError:
        raise inject.Refusal(400, "the request ends before its body does") from None


Connect = Callable[[str, int], Awaitable[Any]]  # a connected socket.socket


async def post(host: str, path: str, data: bytes, *, connect: Connect,
               upstream: ssl.SSLContext) -> tuple[int, bytes]:
    """One JSON POST of the daemon's to host:443 (status, body); OSError or
    ValueError, never with the body in the message."""
    sock = await connect(host, 443)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            sock=sock, ssl=upstream, server_hostname=host, limit=MAX_RESPONSE), TIMEOUT)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise ValueError(f"{host}'s certificate does not verify: {exc.verify_message}") from None
    except BaseException:
        sock.close()
        raise
    try:
        writer.write(write.request("POST", path, [
            ("Host", host), ("Accept", "application/json"),
            ("Content-Type", "application/json"), ("Content-Length", str(len(data))),
            ("Connection", "close")]) + data)
        await writer.drain()
        raw = b""
        while len(raw) <= MAX_RESPONSE:
            more = await asyncio.wait_for(reader.read(MAX_RESPONSE + 1 - len(raw)), TIMEOUT)
            if not more:
                break
            raw += more
        if len(raw) > MAX_RESPONSE:
            raise ValueError(f"{host}'s answer is over {MAX_RESPONSE} bytes")
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, asyncio.TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), 5)
    try:
        head, got = http_body.whole_response(raw, "POST")
    except BadMessage as exc:
        raise ValueError(f"{host}'s answer is not HTTP/1.x: {exc}") from None
    return head.status, got


# One refresh at a time per user: two agents (or two CLIs in one) that
# refresh together would otherwise send the same refresh token twice, and a
# provider that rotates it refuses the second.
_LOCKS: dict[int, asyncio.Lock] = {}


@dataclass
class CliRefresh:
    """One agent's CLI refreshes at its proxy."""

    entries: Sequence[inject.Injection]  # KIND
    injections: Sequence[inject.Injection]  # all the agent's (its login placeholders)
    uid: int
    gid: int
    home: str
    connect: Connect
    upstream: ssl.SSLContext
    now: Callable[[], float] = time.time

    @classmethod
    def of(cls, injections: Sequence[inject.Injection], **kw: Any) -> CliRefresh | None:
        entries = [i for i in injections if i.kind == KIND]
        return cls(entries=entries, injections=injections, **kw) if entries else None

    def _placeholder(self, tool_slug: str, path: Sequence[str]) -> str | None:
        name = injection_name(tool_slug, path)
        return next((i.placeholder for i in self.injections if i.name == name), None)

    async def answer(self, host: str, port: int, req: inject.Request,
                     reader: asyncio.StreamReader) -> tuple[bytes, str] | None:
        bare = req.path.partition("?")[0]
        for entry in self.entries:
            tool_slug = entry.name.split("/")[1]
            r = next((r for r in REFRESHERS if r.slug == tool_slug), None)
            if r is None or not inject.covers(entry, host, port) or bare != r.path:
                continue
            if req.method != "POST":
                return None
            data = await _read_body(reader, req)
            try:
                request = json.loads(data)
            except (UnicodeDecodeError, ValueError, RecursionError):
                request = None
            fields = checked_request(request, entry.placeholder)
            access_ph = self._placeholder(tool_slug, r.access)
            if access_ph is None:
                raise inject.Refusal(403, "this agent's login has no access token to refresh")
            login_file = next(f for f in clilogins.LOGIN_FILES if f.tool == r.tool)
            async with _LOCKS.setdefault(self.uid, asyncio.Lock()):
                real = await asyncio.to_thread(clilogins.read_value, self.uid, self.gid,
                                               self.home, login_file.rel, r.refresh)
                if real is None:
                    raise inject.Refusal(502, f"{r.tool}'s login on the host has no refresh "
                                              "token now")
                try:
                    sent = json.dumps({**fields, "refresh_token": inject.check_secret(real)}
                                      ).encode()
                    status, got = await post(host, r.path, sent, connect=self.connect,
                                             upstream=self.upstream)
                    refreshed = parse_answer(status, got, real)
                except (OSError, ValueError, TimeoutError) as exc:
                    raise inject.Refusal(502, f"the refresh failed: {str(exc)[:200]}") from None
                values: dict[tuple[str, ...], object] = {
                    r.access: refreshed.access, r.refresh: refreshed.refresh}
                if refreshed.expires_in is not None:
                    values[r.expires_ms] = int((self.now() + refreshed.expires_in) * 1000)
                if refreshed.scope is not None:
                    values[r.scopes] = refreshed.scope.split()[:64]
                try:
                    await asyncio.to_thread(clilogins.write_values, self.uid, self.gid,
                                            self.home, login_file.rel, values)
                except (OSError, ValueError) as exc:
                    raise inject.Refusal(502, "the new tokens could not be written to the "
                                              f"host's file: {str(exc)[:200]}") from None
            return agent_answer(refreshed, access_ph, entry.placeholder), entry.name
        return None


def chain(*answers: Callable[[str, int, inject.Request, asyncio.StreamReader],
                             Awaitable[tuple[bytes, str] | None]] | None
          ) -> Callable[[str, int, inject.Request, asyncio.StreamReader],
                        Awaitable[tuple[bytes, str] | None]] | None:
    """The first of several local answers that answers."""
    present = [a for a in answers if a is not None]
    if not present:
        return None

    async def answer(host: str, port: int, req: inject.Request,
                     reader: asyncio.StreamReader) -> tuple[bytes, str] | None:
        for a in present:
            got = await a(host, port, req, reader)
            if got is not None:
                return got
        return None
    return answer
