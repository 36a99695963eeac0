"""The agent CLIs' logins turned into placeholders of the same shape
(creds/clilogins.py, issue 45 item 1's first part): no byte of a secret is
in what an agent would see, the rest is as the CLI wrote it, and each
placeholder maps back to its real value."""

from __future__ import annotations

import base64
import json

from leviathd.proxy import loginfiles as clilogins

JWT_CLAIMS = base64.urlsafe_b64encode(json.dumps(
    {"email": "a@example.org", "https://api.openai.com/auth": {"chatgpt_plan_type": "plus"}}
).encode()).decode().rstrip("=")
ID_TOKEN = f"eyJhbGciOiJSUzI1NiJ9.{JWT_CLAIMS}.c2lnbmF0dXJlLW9mLXRoZS1yZWFsLWlzc3Vlcg"

CLAUDE = {"claudeAiOauth": {"accessToken": "sk-ant-oat01-REAL-access-Aa1-" + "x" * 60,
                            "refreshToken": "sk-ant-ort01-REAL-refresh-" + "y" * 60,
                            "expiresAt": 1748658860401, "scopes": ["user:inference"],
                            "subscriptionType": "max"}}
CODEX = {"OPENAI_API_KEY": None, "last_refresh": "2026-12-01T10:00:00Z",
         "tokens": {"id_token": ID_TOKEN, "access_token": "REALACCESS" + "z" * 40,
                    "refresh_token": "REALREFRESH" + "w" * 40, "account_id": "acct-1"}}
GEMINI = {"access_token": "ya29.REALgoogle" + "g" * 40,
          "refresh_token": "1//REALrefresh" + "r" * 30, "scope": "openid",
          "token_type": "Bearer", "id_token": ID_TOKEN,
          "expiry_date": 1750000000000}


def _reals(doc: object) -> list[str]:
    out: list[str] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if isinstance(v, str) and ("token" in k.lower() or "key" in k.lower()) \
                    and k != "token_type":
                out.append(v)
            out += _reals(v)
    return out


def test_no_secret_reaches_the_placeholder_and_the_shape_stays() -> None:
    for doc in (CLAUDE, CODEX, GEMINI):
        login = clilogins.placeholders("t", ("h",), json.dumps(doc).encode())
        assert login is not None
        shown = json.loads(login.placeholder)
        text = login.placeholder.decode()
        for real in _reals(doc):
            if real.count(".") == 2:  # a JWT: its signature is the secret
                assert real.rsplit(".", 1)[1] not in text
            else:
                assert real not in text and real[len("sk-ant-oat01-"):][:12] not in text
        assert sorted(login.real.values()) == sorted(_reals(doc))
        for stand_in, real in login.real.items():
            assert stand_in in text and stand_in != real and len(stand_in) >= len(real) - 4
        # What is not a secret is as it was.
        assert json.dumps(doc, sort_keys=True).count("expir") == json.dumps(
            shown, sort_keys=True).count("expir")
    claude = json.loads(clilogins.placeholders("t", (), json.dumps(CLAUDE).encode())
                        .placeholder)["claudeAiOauth"]  # type: ignore[union-attr]
    assert claude["accessToken"].startswith("sk-ant-oat01-")
    assert not claude["accessToken"].startswith("sk-ant-oat01-REAL")
    assert claude["subscriptionType"] == "max" and claude["expiresAt"] == 1748658860401
    codex = json.loads(clilogins.placeholders("t", (), json.dumps(CODEX).encode())
                       .placeholder)  # type: ignore[union-attr]
    _head, claims, sig = codex["tokens"]["id_token"].split(".")
    assert claims == JWT_CLAIMS and sig not in ID_TOKEN
    assert codex["OPENAI_API_KEY"] is None and codex["tokens"]["account_id"] == "acct-1"
    gemini = json.loads(clilogins.placeholders("t", (), json.dumps(GEMINI).encode())
                        .placeholder)  # type: ignore[union-attr]
    assert gemini["token_type"] == "Bearer" and gemini["access_token"].startswith("ya29.")


def test_each_agent_gets_its_own_placeholders() -> None:
    a = clilogins.placeholders("t", (), json.dumps(CODEX).encode())
    b = clilogins.placeholders("t", (), json.dumps(CODEX).encode())
    assert a is not None and b is not None and not set(a.real) & set(b.real)


def test_what_is_not_a_login_file_gives_nothing() -> None:
    for data in (b"", b"[1]", b"{", b"\xff", b"[" * 100_000):
        assert clilogins.placeholders("t", (), data) is None
    many = {f"k{i}_token": "v" * 40 for i in range(clilogins.MAX_SECRETS + 1)}
    assert clilogins.placeholders("t", (), json.dumps(many).encode()) is None
