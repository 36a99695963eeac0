"""The daemon's answer to an agent CLI's token refresh (proxy/refresh.py,
issue 45): only the refresh grant with the agent's own placeholder is taken
(a forged or real token is refused before anything is read or sent), the
daemon's request carries the real token with the CLI's client and scope,
and the CLI's answer holds the placeholders and no other secret."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.parse

import pytest

from leviathd.http import message
from leviathd.proxy import inject, logins, refresh
from leviathd.proxy import loginfiles as clilogins

PH = "sk-ant-ort01-" + "p" * 40
ACCESS_PH = "sk-ant-oat01-" + "a" * 40
REAL = "sk-ant-ort01-" + "R" * 40
NEW_ACCESS = "sk-ant-oat01-" + "N" * 40
NEW_REFRESH = "sk-ant-ort01-" + "M" * 40


def cli_request(token: str, **more: object) -> dict[str, object]:
    return {"grant_type": "refresh_token", "refresh_token": token,
            "client_id": "9d1c250a-e61b-44d9-88ed-5944d1962f5e",
            "scope": "user:inference user:profile", **more}


def test_only_the_refresh_grant_with_the_agents_placeholder_is_taken() -> None:
    for bad in (cli_request(REAL), cli_request("sk-ant-ort01-forged"),
                cli_request(PH, grant_type="authorization_code"), [PH], None,
                {"grant_type": "refresh_token"}):
        with pytest.raises(inject.Refusal) as exc:
            refresh.checked_request(bad, PH)
        assert exc.value.status == 403
    kept = refresh.checked_request(cli_request(PH, expires_in=3600, extra="x"), PH)
    assert kept == {"grant_type": "refresh_token",
                    "client_id": "9d1c250a-e61b-44d9-88ed-5944d1962f5e",
                    "scope": "user:inference user:profile", "expires_in": 3600}
    # A client or scope that is no plain short string is not sent on.
    odd = refresh.checked_request(cli_request(PH, client_id="a\r\nb", scope="s" * 600), PH)
    assert "client_id" not in odd and "scope" not in odd


def test_the_provider_answer_is_read_bounded_and_its_refusal_tells_no_secret() -> None:
    got = refresh.parse_answer(200, json.dumps({
        "access_token": NEW_ACCESS, "refresh_token": NEW_REFRESH, "expires_in": 28800,
        "scope": "user:inference"}).encode(), REAL)
    assert (got.access, got.refresh, got.expires_in, got.scope) == (
        NEW_ACCESS, NEW_REFRESH, 28800.0, "user:inference")
    # No new refresh token: the real one stays.
    assert refresh.parse_answer(200, json.dumps({"access_token": NEW_ACCESS}).encode(),
                                REAL).refresh == REAL
    for status, data in ((400, json.dumps({"error": "invalid_grant",
                                           "error_description": REAL}).encode()),
                         (200, b"<html>"), (200, b"[]"),
                         (200, json.dumps({"access_token": "a\r\nb"}).encode())):
        with pytest.raises(ValueError) as exc:
            refresh.parse_answer(status, data, REAL)
        assert REAL not in str(exc.value)


def test_the_cli_gets_the_placeholders_and_no_other_secret() -> None:
    got = refresh.parse_answer(200, json.dumps({
        "token_type": "Bearer", "access_token": NEW_ACCESS, "refresh_token": NEW_REFRESH,
        "expires_in": 28800, "id_token": NEW_ACCESS + "x",
        "account": {"uuid": "u1", "session_key": NEW_REFRESH + "y"}}).encode(), REAL)
    raw = refresh.agent_answer(got, ACCESS_PH, PH)
    head, _ = message.parse_response(raw[:raw.index(b"\r\n\r\n") + 4], "POST")
    assert head.status == 200
    text = raw.decode()
    assert NEW_ACCESS not in text and NEW_REFRESH not in text and REAL not in text
    answer = json.loads(raw[raw.index(b"\r\n\r\n") + 4:])
    assert answer == {"token_type": "Bearer", "access_token": ACCESS_PH, "refresh_token": PH,
                      "expires_in": 28800, "account": {"uuid": "u1"}}


def test_the_token_hosts_are_intercepted_with_the_refresh_placeholder_only() -> None:
    own = [inject.Injection(name="login/claude-code/claudeAiOauth/accessToken", kind="login",
                            hosts=("api.anthropic.com",), placeholder=ACCESS_PH),
           inject.Injection(name="login/claude-code/claudeAiOauth/refreshToken", kind="login",
                            hosts=("api.anthropic.com",), placeholder=PH)]
    entries = refresh.refresh_injections("claude-code", own)
    assert [(e.kind, e.placeholder) for e in entries] == [(refresh.KIND, PH)]
    assert "platform.claude.com" in entries[0].hosts
    # Intercepted for the daemon's answer, never given a secret itself.
    req = inject.parse_head(b"POST /v1/oauth/token HTTP/1.1\r\nHost: platform.claude.com")
    assert inject.applying(entries, req) == []
    assert refresh.refresh_injections("codex", own) == []


# Codex 0.171.0 and Gemini CLI 0.61.0 (/work notes of their requests: Codex's
# JSON body with refresh_reason, Gemini's form body with the client secret).
def _b64(doc: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()


def jwt(**claims: object) -> str:
    return f"{_b64({'alg': 'RS256', 'typ': 'JWT'})}.{_b64(claims)}.{'S' * 43}"


AUTH = {"https://api.openai.com/auth": {"chatgpt_account_id": "acct-123"}}
CODEX_ACCESS = jwt(exp=1000, **AUTH)
CODEX_NEW_ACCESS = jwt(exp=999999, n=2, **AUTH)
CODEX_NEW_ID = jwt(exp=999999, email="alice@example.com", **AUTH)
CODEX_REFRESH = "rt_" + "R" * 40
CODEX_NEW_REFRESH = "rt_" + "M" * 40
SIG_ACCESS, SIG_ID = "a" * 43, "i" * 43
CODEX_RPH = "rt_" + "p" * 40
GEMINI_RPH = "1//" + "p" * 40
GEMINI_REAL = "1//" + "R" * 40


def codex_body(token: str, **more: object) -> bytes:
    return json.dumps({"client_id": "app_EMoamEEZ73f0CkXaXp7hrann",
                       "grant_type": "refresh_token", "refresh_reason": "proactive_expiry",
                       "refresh_token": token, **more}).encode()


def gemini_body(token: str, extra: str = "") -> bytes:
    return (urllib.parse.urlencode({"refresh_token": token, "client_id": "681-x.apps",
                                    "client_secret": "GOCSPX-public", "grant_type":
                                    "refresh_token"}) + extra).encode()


def test_a_jwt_placeholder_is_known_by_its_signature_and_shown_with_the_new_claims() -> None:
    assert clilogins.matched_by(CODEX_ACCESS) == "S" * 43
    assert clilogins.matched_by(CODEX_REFRESH) == CODEX_REFRESH
    shown = refresh.shown_as(CODEX_NEW_ACCESS, SIG_ACCESS)
    head, claims, sig = shown.split(".")
    assert (head, claims) == tuple(CODEX_NEW_ACCESS.split(".")[:2]) and sig == SIG_ACCESS
    # A token that is no JWT: the agent's placeholder as it is.
    assert refresh.shown_as(NEW_ACCESS, ACCESS_PH) == ACCESS_PH


def test_codex_and_gemini_requests_are_taken_only_with_the_agents_placeholder() -> None:
    kept = refresh.checked_request(refresh.parse_request(codex_body(CODEX_RPH), False),
                                   CODEX_RPH, ("client_id", "refresh_reason"))
    assert kept == {"grant_type": "refresh_token", "client_id": "app_EMoamEEZ73f0CkXaXp7hrann",
                    "refresh_reason": "proactive_expiry"}
    kept = refresh.checked_request(refresh.parse_request(gemini_body(GEMINI_RPH), True),
                                   GEMINI_RPH, ("client_id", "client_secret"))
    assert kept == {"grant_type": "refresh_token", "client_id": "681-x.apps",
                    "client_secret": "GOCSPX-public"}
    # Attacker's side: another refresh token (the real one, a forged one),
    # another grant, a form field twice (which one would the provider take?),
    # too many fields, bytes that are no form.
    for data, form in ((codex_body(CODEX_REFRESH), False), (codex_body("rt_forged"), False),
                       (codex_body(CODEX_RPH, grant_type="authorization_code"), False),
                       (gemini_body(GEMINI_REAL), True),
                       (gemini_body(GEMINI_REAL, "&refresh_token=" + GEMINI_RPH), True),
                       (gemini_body(GEMINI_RPH, "".join(f"&x{i}=1" for i in range(20))), True),
                       (gemini_body(GEMINI_RPH).replace(b"&", b"\xff"), True)):
        with pytest.raises(inject.Refusal) as exc:
            refresh.checked_request(refresh.parse_request(data, form), CODEX_RPH if not form
                                    else GEMINI_RPH)
        assert exc.value.status == 403


def test_codex_gets_placeholder_jwts_with_the_new_claims_and_no_real_token() -> None:
    got = refresh.parse_answer(200, json.dumps({
        "access_token": CODEX_NEW_ACCESS, "refresh_token": CODEX_NEW_REFRESH,
        "id_token": CODEX_NEW_ID, "expires_in": 864000}).encode(), CODEX_REFRESH)
    raw = refresh.agent_answer(got, SIG_ACCESS, CODEX_RPH, SIG_ID)
    answer = json.loads(raw[raw.index(b"\r\n\r\n") + 4:])
    assert answer["access_token"] == refresh.shown_as(CODEX_NEW_ACCESS, SIG_ACCESS)
    assert answer["id_token"] == refresh.shown_as(CODEX_NEW_ID, SIG_ID)
    assert answer["refresh_token"] == CODEX_RPH
    for real in (CODEX_NEW_ACCESS, CODEX_NEW_ID, CODEX_NEW_REFRESH, CODEX_REFRESH, "S" * 43):
        assert real not in raw.decode()
    # No ID token held by the agent: none given.
    raw = refresh.agent_answer(got, SIG_ACCESS, CODEX_RPH, None)
    assert "id_token" not in json.loads(raw[raw.index(b"\r\n\r\n") + 4:])


def test_the_files_get_the_tokens_expiry_and_refresh_time_as_each_cli_keeps_them() -> None:
    codex, gemini = refresh.REFRESHERS[1], refresh.REFRESHERS[2]
    got = refresh.parse_answer(200, json.dumps({
        "access_token": CODEX_NEW_ACCESS, "id_token": CODEX_NEW_ID,
        "expires_in": 3599, "scope": "a b"}).encode(), CODEX_REFRESH)
    assert refresh.file_values(codex, got, 0.0, access="A", refresh="R", id_token="I") == {
        ("tokens", "access_token"): "A", ("tokens", "refresh_token"): "R",
        ("tokens", "id_token"): "I", ("last_refresh",): "1970-01-01T00:00:00.000000Z"}
    assert refresh.file_values(gemini, got, 10.0, access="A", refresh="R", id_token=None) == {
        ("access_token",): "A", ("refresh_token",): "R", ("expiry_date",): 3609000,
        ("scope",): "a b"}
    assert refresh.agent_file_name("codex") == logins.file_name(clilogins.LOGIN_FILES[1])
    assert refresh.agent_file_name("gemini-cli") == logins.file_name(clilogins.LOGIN_FILES[2])


class _Daemon:
    """CliRefresh with the host's file, the agent's file and the provider
    stood in for (what each would have been given is kept)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answer: bytes,
                 host_access: str | None = None) -> None:
        self.sent: list[tuple[str, str, bytes, bool]] = []
        self.host: list[dict[tuple[str, ...], object]] = []
        self.agent: list[dict[tuple[str, ...], object]] = []

        async def post(host: str, path: str, data: bytes, *, connect: object,
                       upstream: object, form: bool = False) -> tuple[int, bytes]:
            self.sent.append((host, path, data, form))
            return 200, answer

        monkeypatch.setattr(refresh, "post", post)
        monkeypatch.setattr(clilogins, "read_value", lambda *a: {
            ("tokens", "refresh_token"): CODEX_REFRESH, ("refresh_token",): GEMINI_REAL,
            ("tokens", "access_token"): host_access, ("tokens", "id_token"): CODEX_NEW_ID,
        }.get(tuple(a[4])))
        monkeypatch.setattr(clilogins, "write_values", lambda *a: self.host.append(a[4]))
        monkeypatch.setattr(refresh, "write_agent_file", lambda a, s, v: self.agent.append(v))

    def refresher(self, slug: str, hosts: tuple[str, ...]) -> refresh.CliRefresh:
        names = {"codex": (("tokens", "access_token"), ("tokens", "id_token"),
                           ("tokens", "refresh_token")),
                 "gemini-cli": (("access_token",), ("id_token",), ("refresh_token",))}[slug]
        phs = {"codex": (SIG_ACCESS, SIG_ID, CODEX_RPH),
               "gemini-cli": ("ya29." + "a" * 40, SIG_ID, GEMINI_RPH)}[slug]
        own = [inject.Injection(name=refresh.injection_name(slug, n), kind="login",
                                hosts=hosts, placeholder=p)
               for n, p in zip(names, phs, strict=True)]
        got = refresh.CliRefresh.of([*own, *refresh.refresh_injections(slug, own)], uid=1000,
                                    gid=1000, home="/home/alice", connect=None,
                                    upstream=None, now=lambda: 100.0, agent_id="a1b2c3d4")
        assert got is not None
        return got


def _ask(cli: refresh.CliRefresh, host: str, path: str, body: bytes, *,
         length: int | None = None, rest: bytes = b"") -> tuple[bytes, str] | None:
    async def go() -> tuple[bytes, str] | None:
        reader = asyncio.StreamReader()
        reader.feed_data(body + rest)
        reader.feed_eof()
        req = inject.parse_head(f"POST {path} HTTP/1.1\r\nHost: {host}\r\n"
                                f"Content-Length: {len(body) if length is None else length}"
                                .encode())
        got = await cli.answer(host, 443, req, reader)
        assert await reader.read() == rest[:]  # nothing past the body was read
        return got
    return asyncio.run(go())


def test_codexs_refresh_is_answered_the_host_and_agent_files_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = _Daemon(monkeypatch, json.dumps({
        "access_token": CODEX_NEW_ACCESS, "refresh_token": CODEX_NEW_REFRESH,
        "id_token": CODEX_NEW_ID}).encode())
    cli = daemon.refresher("codex", ("api.openai.com", "chatgpt.com", "auth.openai.com"))
    got = _ask(cli, "auth.openai.com", "/oauth/token", codex_body(CODEX_RPH))
    assert got is not None and got[1] == "login/codex/refresh"
    (host, path, data, form), = daemon.sent
    assert (host, path, form) == ("auth.openai.com", "/oauth/token", False)
    assert json.loads(data) == {**json.loads(codex_body(CODEX_REFRESH))}
    assert daemon.host == [{("tokens", "access_token"): CODEX_NEW_ACCESS,
                            ("tokens", "refresh_token"): CODEX_NEW_REFRESH,
                            ("tokens", "id_token"): CODEX_NEW_ID,
                            ("last_refresh",): "1970-01-01T00:01:40.000000Z"}]
    assert daemon.agent == [{("tokens", "access_token"): refresh.shown_as(CODEX_NEW_ACCESS,
                                                                         SIG_ACCESS),
                             ("tokens", "refresh_token"): CODEX_RPH,
                             ("tokens", "id_token"): refresh.shown_as(CODEX_NEW_ID, SIG_ID),
                             ("last_refresh",): "1970-01-01T00:01:40.000000Z"}]
    for real in (CODEX_NEW_ACCESS, CODEX_NEW_ID, CODEX_NEW_REFRESH, CODEX_REFRESH):
        assert real not in got[0].decode() and real not in json.dumps(
            [list(v.values()) for v in daemon.agent])


def test_geminis_form_refresh_is_answered_and_sent_on_as_a_form(
        monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = _Daemon(monkeypatch, json.dumps({
        "access_token": "ya29.NEW" + "n" * 40, "expires_in": 3599, "token_type": "Bearer",
        "scope": "https://www.googleapis.com/auth/cloud-platform"}).encode())
    cli = daemon.refresher("gemini-cli", ("oauth2.googleapis.com",))
    got = _ask(cli, "oauth2.googleapis.com", "/token", gemini_body(GEMINI_RPH))
    assert got is not None
    (_, path, data, form), = daemon.sent
    assert path == "/token" and form
    assert dict(urllib.parse.parse_qsl(data.decode())) == dict(
        urllib.parse.parse_qsl(gemini_body(GEMINI_REAL).decode()))
    assert daemon.host[0][("expiry_date",)] == (100 + 3599) * 1000
    answer = json.loads(got[0][got[0].index(b"\r\n\r\n") + 4:])
    assert answer["access_token"] == "ya29." + "a" * 40 and answer["refresh_token"] == GEMINI_RPH


def test_an_attackers_refresh_sends_nothing_on_and_writes_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another refresh token, a forged grant, a body over the bound, a
    second request smuggled in the body or after it."""
    daemon = _Daemon(monkeypatch, b"{}")
    cli = daemon.refresher("codex", ("auth.openai.com",))
    smuggled = codex_body(CODEX_RPH) + (b"POST /oauth/token HTTP/1.1\r\nHost: auth.openai.com"
                                        b"\r\nContent-Length: 2\r\n\r\n{}")
    for body, length, status in ((codex_body(CODEX_REFRESH), None, 403),
                                 (codex_body("rt_forged"), None, 403),
                                 (codex_body(CODEX_RPH, grant_type="password"), None, 403),
                                 (b"{" + b" " * refresh.MAX_BODY + b"}", None, 413),
                                 (smuggled, None, 403)):
        with pytest.raises(inject.Refusal) as exc:
            _ask(cli, "auth.openai.com", "/oauth/token", body, length=length)
        assert exc.value.status == status
    # The request whose length ends at its body, a second one after it: the
    # one refresh is answered; what follows is never read (one request per
    # connection: proxy/tls.py closes it after the answer).
    daemon2 = _Daemon(monkeypatch, json.dumps({"access_token": CODEX_NEW_ACCESS}).encode())
    cli = daemon2.refresher("codex", ("auth.openai.com",))
    assert _ask(cli, "auth.openai.com", "/oauth/token", codex_body(CODEX_RPH),
                rest=smuggled) is not None
    assert len(daemon2.sent) == 1
    assert daemon.sent == [] and daemon.host == [] and daemon.agent == []


def test_a_codex_refresh_asked_for_a_stale_copy_is_answered_from_the_fresh_host_file(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's access token has over FRESH seconds left (another agent's
    refresh, the CLI on the host): Codex asking because its own copy is old
    gets the host's tokens as placeholders, and nothing goes to the provider,
    whose refresh tokens may be single-use; when Codex says the provider
    refused its token (unauthorized_recovery), or the host's token is near
    its expiry too, the daemon refreshes."""
    fresh = jwt(exp=100 + refresh.FRESH + 60, **AUTH)
    daemon = _Daemon(monkeypatch, json.dumps({"access_token": CODEX_NEW_ACCESS}).encode(),
                     host_access=fresh)
    cli = daemon.refresher("codex", ("auth.openai.com",))
    got = _ask(cli, "auth.openai.com", "/oauth/token", codex_body(CODEX_RPH))
    assert got is not None and daemon.sent == [] and daemon.host == []
    answer = json.loads(got[0][got[0].index(b"\r\n\r\n") + 4:])
    assert answer == {"access_token": refresh.shown_as(fresh, SIG_ACCESS),
                      "refresh_token": CODEX_RPH,
                      "id_token": refresh.shown_as(CODEX_NEW_ID, SIG_ID)}
    assert daemon.agent[0][("tokens", "access_token")] == refresh.shown_as(fresh, SIG_ACCESS)
    _ask(cli, "auth.openai.com", "/oauth/token",
         codex_body(CODEX_RPH, refresh_reason="unauthorized_recovery"))
    assert len(daemon.sent) == 1 and len(daemon.host) == 1
    near = _Daemon(monkeypatch, json.dumps({"access_token": CODEX_NEW_ACCESS}).encode(),
                   host_access=jwt(exp=100 + refresh.FRESH, **AUTH))
    _ask(near.refresher("codex", ("auth.openai.com",)), "auth.openai.com", "/oauth/token",
         codex_body(CODEX_RPH))
    assert len(near.sent) == 1 and len(near.host) == 1
    assert refresh.jwt_exp("a.b") is None and refresh.jwt_exp(fresh) == 100 + refresh.FRESH + 60
