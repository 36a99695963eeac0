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
  descriptor, a new file renamed over the old one, other keys
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
Codex 0.171.0 (run against a stand-in): POST https://auth.openai.com/oauth/token,
a JSON body {client_id, grant_type, refresh_reason, refresh_token}; it
refreshes when its access token's (a JWT's) `exp` is within about 5 minutes,
reads id_token, access_token and refresh_token (each optional), and keeps
`last_refresh` in auth.json. Gemini CLI 0.61.0 (google-auth-library
10.9.0, read from its npm bundle): POST https://oauth2.googleapis.com/token,
a form body {refresh_token, client_id, client_secret, grant_type}; it
refreshes when `expiry_date` (epoch ms) is within 5 minutes.

Codex and Gemini CLI cannot save what they get inside the agent (their
file is a read-only bind of a placeholder file), and Codex then keeps its
old token in memory and asks again at each request. So for them the daemon
also rewrites the agent's own placeholder file (`Refresher.agent_file`; in
place: the agent's bind is on its inode) with the new placeholders and the
new expiry, which Codex reads again before it would refresh. A JWT's
placeholder is the new token's header and claims (the new `exp`: the CLI
decides when to refresh as it would on the host) with the agent's same
random signature, which is what the injector knows it by
(loginfiles.matched_by).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import os
import re
import ssl
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from leviathd import fsat
from leviathd.gate.service import agent_dir
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
    expires_ms: tuple[str, ...]  # epoch milliseconds; () when the file has none
    scopes: tuple[str, ...]  # () when the file keeps none
    scope_list: bool = True  # the file's scopes a list (else one string)
    form: bool = False  # the request's body form-encoded (else JSON)
    # The CLI's request fields sent on (plain short strings), besides the grant.
    fields: tuple[str, ...] = ("client_id", "scope")
    id_token: tuple[str, ...] = ()  # where the file keeps an ID token (a JWT)
    last_refresh: tuple[str, ...] = ()  # an RFC 3339 time the CLI keeps
    # The agent's placeholder file rewritten with the new placeholders (the
    # CLI cannot save them itself: module docstring).
    agent_file: bool = False
    # A refresh the CLI asks for only because its own view is stale (its
    # `refresh_reason` one of FROM_FILE_REASONS) answered from the host's
    # file while its access token (a JWT) has over FRESH seconds left.
    from_file: bool = False


REFRESHERS: tuple[Refresher, ...] = (
    # console.anthropic.com: the endpoint of the CLI's earlier versions.
    Refresher("Claude Code", "claude-code", ("platform.claude.com", "console.anthropic.com"),
              "/v1/oauth/token", ("claudeAiOauth", "accessToken"),
              ("claudeAiOauth", "refreshToken"), ("claudeAiOauth", "expiresAt"),
              ("claudeAiOauth", "scopes")),
    Refresher("Codex", "codex", ("auth.openai.com",), "/oauth/token",
              ("tokens", "access_token"), ("tokens", "refresh_token"), (), (),
              fields=("client_id", "refresh_reason"), id_token=("tokens", "id_token"),
              last_refresh=("last_refresh",), agent_file=True, from_file=True),
    Refresher("Gemini CLI", "gemini-cli", ("oauth2.googleapis.com",), "/token",
              ("access_token",), ("refresh_token",), ("expiry_date",), ("scope",),
              scope_list=False, form=True, fields=("client_id", "client_secret"),
              id_token=("id_token",), agent_file=True),
)

_FIELD = re.compile(r"^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$")
_JWT = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")
_SIGNATURE = re.compile(r"^[A-Za-z0-9_-]+$")
MAX_FORM_FIELDS = 16
# Codex asks for a refresh when its access token's `exp` is within about 300
# s; a host token with more left than this is one it would not refresh.
FRESH = 600.0
FROM_FILE_REASONS = ("proactive_expiry", "scheduled")
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


def parse_request(data: bytes, form: bool) -> object:
    """The CLI's request body (pure): a JSON value, or a form's fields as a
    dict (each named once, at most MAX_FORM_FIELDS); None when unreadable."""
    if not form:
        try:
            return json.loads(data)
        except (UnicodeDecodeError, ValueError, RecursionError):
            return None
    try:
        pairs = urllib.parse.parse_qsl(data.decode("ascii"), keep_blank_values=True,
                                       strict_parsing=True, max_num_fields=MAX_FORM_FIELDS)
    except (UnicodeDecodeError, ValueError):
        return None
    out = dict(pairs)
    return out if len(out) == len(pairs) else None  # a field twice: which one is meant?


def checked_request(request: object, placeholder: str,
                    fields: Sequence[str] = ("client_id", "scope")) -> dict[str, object]:
    """The daemon's own refresh request (pure) from the CLI's, without the
    refresh token: its `fields` kept when they are plain short strings.
    Raises Refusal when the CLI's is not the refresh grant with exactly
    this agent's placeholder (a JWT's: its random signature)."""
    token = request.get("refresh_token") if isinstance(request, dict) else None
    if (not isinstance(request, dict) or request.get("grant_type") != "refresh_token"
            or not isinstance(token, str)
            or clilogins.matched_by(token) != placeholder):
        raise inject.Refusal(403, "the token endpoint is answered by leviathd for the CLI's "
                                  "login: only a refresh with the agent's placeholder refresh "
                                  "token; nothing was sent on")
    out: dict[str, object] = {"grant_type": "refresh_token"}
    for key in fields:
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
    id_token: str | None = None  # a JWT's, else none


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
    id_token = doc.get("id_token")
    return Refreshed(access, refresh, expires_in, _field(doc.get("scope")), doc,
                     id_token if isinstance(id_token, str) and len(id_token) <= MAX_RESPONSE
                     and _JWT.match(id_token) else None)


def _shown(value: Any, depth: int) -> Any:
    """The provider's JSON without a secret-named string at any depth."""
    if isinstance(value, dict) and depth < clilogins.MAX_DEPTH:
        return {k: _shown(v, depth + 1) for k, v in value.items()
                if not (isinstance(v, str) and _SECRET_KEY.search(k) and k != "token_type")}
    if isinstance(value, list) and depth < clilogins.MAX_DEPTH:
        return [_shown(v, depth + 1) for v in value]
    return value if not isinstance(value, (dict, list)) else None


def shown_as(real: str, placeholder: str) -> str:
    """The placeholder the agent gets for a new real token (pure): a JWT's
    header and claims (not secret; the CLI reads `exp` and the account in
    them) with the agent's random signature, which the injector knows the
    placeholder by; any other token the agent's placeholder as it is."""
    if _JWT.match(real) and _SIGNATURE.match(placeholder):
        head, claims, _ = real.split(".")
        return f"{head}.{claims}.{placeholder}"
    return placeholder


def agent_answer(refreshed: Refreshed, access_ph: str, refresh_ph: str,
                 id_ph: str | None = None) -> bytes:
    """What the CLI gets (pure): the provider's JSON with the tokens the
    agent's placeholders, and any other secret-named string dropped. An ID
    token is given as a placeholder JWT (its claims, the agent's signature)
    where the agent holds one: Codex saves it and reads the account from it.
    Not the real one: OpenAI's ID token is what Codex exchanges for an API
    key (its 0.171.0 binary holds the token-exchange grant with an id_token
    subject for an `openai-api-key`), so it is a bearer credential."""
    shown = _shown(refreshed.answer, 0)
    shown["access_token"] = shown_as(refreshed.access, access_ph)
    shown["refresh_token"] = shown_as(refreshed.refresh, refresh_ph)
    if refreshed.id_token is not None and id_ph is not None:
        shown["id_token"] = shown_as(refreshed.id_token, id_ph)
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
               upstream: ssl.SSLContext, form: bool = False) -> tuple[int, bytes]:
    """One POST of the daemon's to host:443, its body JSON or a form
    (status, body); OSError or ValueError, never with the body in the
    message."""
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
            ("Content-Type", "application/x-www-form-urlencoded" if form
             else "application/json"), ("Content-Length", str(len(data))),
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


def jwt_exp(token: str) -> float | None:
    """A JWT's `exp` claim (pure; the signature is not checked: the daemon
    read the token from the user's own file), None for anything else."""
    if not _JWT.match(token) or len(token) > MAX_RESPONSE:
        return None
    claims = token.split(".")[1]
    try:
        doc = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    exp = doc.get("exp") if isinstance(doc, dict) else None
    return float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None


def _rfc3339(when: float) -> str:
    return datetime.datetime.fromtimestamp(when, datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ")


def file_values(r: Refresher, refreshed: Refreshed, now: float, *, access: str,
                refresh: str, id_token: str | None) -> dict[tuple[str, ...], object]:
    """What a refresh sets in a login file (pure): the host's (the real
    tokens) or the agent's (its placeholders), with the new expiry, scope
    and refresh time the CLI keeps."""
    values: dict[tuple[str, ...], object] = {r.access: access, r.refresh: refresh}
    if r.id_token and id_token is not None:
        values[r.id_token] = id_token
    if r.expires_ms and refreshed.expires_in is not None:
        values[r.expires_ms] = int((now + refreshed.expires_in) * 1000)
    if r.scopes and refreshed.scope is not None:
        values[r.scopes] = (refreshed.scope.split()[:64] if r.scope_list else refreshed.scope)
    if r.last_refresh:
        values[r.last_refresh] = _rfc3339(now)
    return values


def agent_file_name(tool_slug: str) -> str:
    """The placeholder file's name in the agent's folder (proxy/logins.py
    `file_name`, which imports this module)."""
    return f"login-{tool_slug}.json"


def write_agent_file(agent_id: str, tool_slug: str,
                     values: dict[tuple[str, ...], object]) -> None:
    """The agent's placeholder file (root's, in its folder, bound read-only
    into the agent) updated in place: the bind is on its inode, and a new
    file renamed over its name would not be what the agent sees."""
    name = agent_file_name(tool_slug)
    fd = fsat.open_dir(agent_dir(agent_id))
    try:
        file_fd = fsat.open_at(fd, name, os.O_RDWR | os.O_NONBLOCK)
        try:
            clilogins.update_in_place(file_fd, name, values)
        finally:
            os.close(file_fd)
    finally:
        os.close(fd)


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
    agent_id: str | None = None  # its placeholder files rewritten (Refresher.agent_file)

    @classmethod
    def of(cls, injections: Sequence[inject.Injection], **kw: Any) -> CliRefresh | None:
        entries = [i for i in injections if i.kind == KIND]
        return cls(entries=entries, injections=injections, **kw) if entries else None

    def _placeholder(self, tool_slug: str, path: Sequence[str]) -> str | None:
        if not path:
            return None
        name = injection_name(tool_slug, path)
        return next((i.placeholder for i in self.injections if i.name == name), None)

    async def _from_file(self, r: Refresher, rel: tuple[str, ...], real: str, now: float,
                         fields: dict[str, object]) -> Refreshed | None:
        """The host's tokens as they are, when the CLI asks only because its
        own copy looks stale and the host's access token has over FRESH
        seconds left (refreshed since by the daemon for another agent, by
        the CLI on the host, or the CLI inside could not read the agent's
        rewritten file): nothing is sent to the provider, whose refresh
        tokens may be single-use. A CLI that says the provider refused its
        token (Codex's `unauthorized_recovery`) gets a real refresh."""
        if not r.from_file or fields.get("refresh_reason") not in FROM_FILE_REASONS:
            return None
        access = await asyncio.to_thread(clilogins.read_value, self.uid, self.gid, self.home,
                                         rel, r.access)
        exp = jwt_exp(access) if access is not None else None
        if access is None or exp is None or exp - now <= FRESH:
            return None
        id_token = (await asyncio.to_thread(clilogins.read_value, self.uid, self.gid,
                                            self.home, rel, r.id_token) if r.id_token else None)
        try:
            return Refreshed(inject.check_secret(access), real, None, None, {},
                             id_token if id_token is not None and _JWT.match(id_token)
                             else None)
        except ValueError:
            return None

    async def _from_provider(self, r: Refresher, host: str, rel: tuple[str, ...], real: str,
                             now: float, fields: dict[str, object]) -> Refreshed:
        """The daemon's refresh at the provider with the real refresh token,
        the new tokens written to the host's file as the user."""
        try:
            body = {**fields, "refresh_token": inject.check_secret(real)}
            sent = (urllib.parse.urlencode(body) if r.form else json.dumps(body)).encode()
            status, got = await post(host, r.path, sent, connect=self.connect,
                                     upstream=self.upstream, form=r.form)
            refreshed = parse_answer(status, got, real)
        except (OSError, ValueError, TimeoutError) as exc:
            raise inject.Refusal(502, f"the refresh failed: {str(exc)[:200]}") from None
        try:
            await asyncio.to_thread(
                clilogins.write_values, self.uid, self.gid, self.home, rel,
                file_values(r, refreshed, now, access=refreshed.access,
                            refresh=refreshed.refresh, id_token=refreshed.id_token))
        except (OSError, ValueError) as exc:
            raise inject.Refusal(502, "the new tokens could not be written to the "
                                      f"host's file: {str(exc)[:200]}") from None
        return refreshed

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
            fields = checked_request(parse_request(data, r.form), entry.placeholder, r.fields)
            access_ph = self._placeholder(tool_slug, r.access)
            if access_ph is None:
                raise inject.Refusal(403, "this agent's login has no access token to refresh")
            id_ph = self._placeholder(tool_slug, r.id_token)
            login_file = next(f for f in clilogins.LOGIN_FILES if f.tool == r.tool)
            async with _LOCKS.setdefault(self.uid, asyncio.Lock()):
                real = await asyncio.to_thread(clilogins.read_value, self.uid, self.gid,
                                               self.home, login_file.rel, r.refresh)
                if real is None:
                    raise inject.Refusal(502, f"{r.tool}'s login on the host has no refresh "
                                              "token now")
                now = self.now()
                refreshed = await self._from_file(r, login_file.rel, real, now, fields)
                if refreshed is None:
                    refreshed = await self._from_provider(r, host, login_file.rel, real, now,
                                                          fields)
                id_shown = (shown_as(refreshed.id_token, id_ph)
                            if refreshed.id_token is not None and id_ph is not None else None)
                if r.agent_file and self.agent_id is not None:
                    try:
                        await asyncio.to_thread(write_agent_file, self.agent_id, tool_slug,
                                                file_values(
                                                    r, refreshed, now,
                                                    access=shown_as(refreshed.access, access_ph),
                                                    refresh=shown_as(refreshed.refresh,
                                                                     entry.placeholder),
                                                    id_token=id_shown))
                    except (OSError, ValueError):
                        pass  # the CLI then asks again; the host's file has the tokens
            return agent_answer(refreshed, access_ph, entry.placeholder, id_ph), entry.name
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
