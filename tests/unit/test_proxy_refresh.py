"""The daemon's answer to an agent CLI's token refresh (proxy/refresh.py,
issue 45): only the refresh grant with the agent's own placeholder is taken
(a forged or real token is refused before anything is read or sent), the
daemon's request carries the real token with the CLI's client and scope,
and the CLI's answer holds the placeholders and no other secret."""

from __future__ import annotations

import json

import pytest

from leviathd.http import message
from leviathd.proxy import inject, refresh

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
