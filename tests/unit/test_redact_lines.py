"""The credential tool's output redaction (leviathd/broker/credentials.py) for a
secret of several lines (issue 30's hold-out attacks)."""

from __future__ import annotations

from leviathd.broker.credentials import redact


def test_each_line_of_a_two_line_secret_is_redacted() -> None:
    """The hold-out attack: a two-line secret file, and the wrapped CLI
    printed its first line; the redaction matched only the whole secret
    (seen failing on the old redact: the first line came back)."""
    secret = "ghp_firstline123\nsecondline456"
    out = redact("token: ghp_firstline123\nother: secondline456\nall: " + secret, secret)
    assert "ghp_firstline123" not in out and "secondline456" not in out, out
    assert redact("a b\n", "a\nb") == "a b\n"  # short lines alone are not redacted
