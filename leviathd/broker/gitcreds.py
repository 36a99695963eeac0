"""The broker's side of git over HTTP(S): the sandbox's credential helper
calls the `git_fetch` or `git_push` tool with the URL git asks about, and
gets the user name and token of the `kind = "git"` credential covering its
host, if one does and allows that operation.

Which of the two tools the helper calls is its guess (from the git command
that started it), and the agent could call either itself: the boundary is
the gate (git_push asks by default) and which token the config gives for
which operation, not the guess. A token handed out is in the sandbox from
then on, in git's memory and readable by the agent; docs/security-model.md
says what that means for the token to configure."""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from leviathd.domain.credentials import CredentialSpec
from leviathd.errors import InvalidArgument, NotFound
from leviathd.hosts import canonical_host

_DEFAULT_PORT = {"http": 80, "https": 443}
MAX_URL = 2048


def parse_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) of the URL git asked about; bounded and
    checked, as it comes from the agent."""
    if len(url) > MAX_URL or any(c in url for c in "\r\n\t\0 "):
        raise InvalidArgument("not a URL git would ask about (too long, or control characters)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidArgument(f"not a valid URL: {exc}") from None
    if parts.scheme not in _DEFAULT_PORT or not parts.hostname:
        raise InvalidArgument(f"git credentials are for http(s) URLs, not {url[:80]!r}")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise InvalidArgument("the URL carries a user, a query or a fragment")
    # The one form rules and credential patterns compare (leviathd/hosts.py).
    host = canonical_host(parts.hostname)
    if host is None:
        raise InvalidArgument(f"not a valid host name in {url[:80]!r}")
    return parts.scheme, host, port or _DEFAULT_PORT[parts.scheme], parts.path.lstrip("/")


def target(url: str) -> str:
    """What the gate, the approvals and the audit see: host[:port]/path."""
    scheme, host, port, path = parse_url(url)
    where = host if port == _DEFAULT_PORT[scheme] else f"{host}:{port}"
    return f"{scheme}://{where}/{path}"


def covers(spec: CredentialSpec, scheme: str, host: str, port: int) -> bool:
    """A pattern with a port covers that port; one without, the scheme's own."""
    if scheme == "http" and not spec.allow_http:
        return False
    for pattern in spec.hosts:
        name, _, want = pattern.partition(":")
        if want:
            if int(want) == port and fnmatchcase(host, name):
                return True
        elif port == _DEFAULT_PORT[scheme] and fnmatchcase(host, name):
            return True
    return False


def pick(credentials: Mapping[str, CredentialSpec], tool: str, url: str
         ) -> tuple[str, CredentialSpec]:
    """The credential (by name, first in name order) covering the URL for
    the tool's operation, or NotFound."""
    scheme, host, port, _ = parse_url(url)
    op = "push" if tool == "git_push" else "fetch"
    for name in sorted(credentials):
        spec = credentials[name]
        if spec.kind == "git" and op in spec.access and covers(spec, scheme, host, port):
            return name, spec
    raise NotFound(f"no git credential covers {op} for {host}:{port}")


def check_token(secret: str) -> str:
    """The git credential protocol is line-based: a token with a line break
    or NUL would let it end one field and start another."""
    if not secret or any(c in secret for c in "\n\r\0"):
        raise InvalidArgument("the git credential's secret is empty or holds a line break")
    return secret
