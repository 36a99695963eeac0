"""Which covered host, if any, a host key belongs to: the known_hosts lookup
of the SSH agent (creds/sshagent.py), by the key the server proved it holds.
OpenSSH's own destination constraints name hosts by their keys the same way."""

from __future__ import annotations

import base64
import hashlib
import hmac
from fnmatch import fnmatchcase


def _split_pattern(pattern: str) -> tuple[str, int]:
    host, _, port = pattern.partition(":")
    return host, int(port) if port else 22


def _known_name(name: str) -> tuple[str, int]:
    if name.startswith("[") and "]:" in name:
        host, _, port = name[1:].partition("]:")
        return host.lower(), int(port) if port.isdigit() else -1
    return name.lower(), 22


def _hashed_matches(entry: str, name: str) -> bool:
    try:
        _, one, salt, digest = entry.split("|")
        if one != "1":
            return False
        mac = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
        return hmac.compare_digest(mac, base64.b64decode(digest))
    except ValueError:
        return False


def covered_name(text: str, hostkey: bytes, patterns: tuple[str, ...]) -> str | None:
    """The first name (host or [host]:port) with this host key in a
    known_hosts text that one of the patterns covers; None if none. A key
    marked @revoked anywhere in the text covers nothing; @cert-authority
    lines and lines with negated names are skipped (certificates are not
    supported, and a negation could only narrow a line we would widen)."""
    found: str | None = None
    for line in text.splitlines()[:100_000]:
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = fields.pop(0) if fields[0].startswith("@") else ""
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except ValueError:
            continue
        if blob != hostkey:
            continue
        if marker == "@revoked":
            return None
        if marker or found is not None:
            continue
        names = fields[0].split(",")
        if any(n.startswith("!") for n in names):
            continue
        for name in names:
            for pattern in patterns:
                want_host, want_port = _split_pattern(pattern)
                if name.startswith("|"):
                    if any(c in want_host for c in "*?["):
                        continue  # a hashed name can only be tested by exact name
                    exact = want_host if want_port == 22 else f"[{want_host}]:{want_port}"
                    if _hashed_matches(name, exact):
                        found = exact
                        break
                    continue
                host, port = _known_name(name)
                if port == want_port and fnmatchcase(host, want_host):
                    found = name
                    break
            if found is not None:
                break
    return found
