"""The tools' calling conventions, from the registry's schemas
(leviathd/domain/tools.py): arguments checked against them, positional forms
(for `lev tool NAME ARGS...`), and the `Call` the gate sees for a given set of
arguments."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from leviathd.broker.gitcreds import target as git_target
from leviathd.domain.tools import TOOLS, ToolKind
from leviathd.errors import InvalidArgument
from leviathd.hosts import canonical_host
from leviathd.policy.decision import Call, normalise


def args_from_positional(tool: str, values: Sequence[str]) -> dict[str, Any]:
    spec = TOOLS.get(tool)
    if spec is None:
        # Unknown tools still go to the broker, which refuses them (and audits it).
        return {"args": list(values)}
    args: dict[str, Any] = {}
    rest = list(values)
    for name in spec.positional:
        if not rest:
            break
        args[name] = rest.pop(0)
    if spec.variadic is not None:
        kind = next(p.type for p in spec.params if p.name == spec.variadic)
        if kind == "array":
            args[spec.variadic] = rest
        elif rest:
            args[spec.variadic] = " ".join(rest)
        rest = []
    if rest:
        raise InvalidArgument(f"{tool}: too many arguments: {' '.join(rest)}")
    return args


def validate(tool: str, args: Mapping[str, Any]) -> None:
    spec = TOOLS.get(tool)
    if spec is None:
        return
    known = {p.name: p for p in spec.params}
    for key in args:
        if key not in known:
            raise InvalidArgument(f"{tool}: unknown argument {key!r}")
    for p in spec.params:
        if p.name not in args:
            if p.required:
                raise InvalidArgument(f"{tool}: missing argument {p.name!r}")
            continue
        value = args[p.name]
        ok = {
            "string": isinstance(value, str),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "boolean": isinstance(value, bool),
            "array": isinstance(value, list) and all(isinstance(v, str) for v in value),
            "object": isinstance(value, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()),
        }[p.type]
        if not ok:
            raise InvalidArgument(f"{tool}: argument {p.name!r} must be a {p.type}")


_SHOWN_URL = 200


def shown_url(url: str) -> str:
    return repr(url if len(url) <= _SHOWN_URL else url[:_SHOWN_URL] + "…")


def host_of(url: str) -> str:
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port out of range or not a number
    except ValueError as exc:
        raise InvalidArgument(f"not a valid URL ({exc}): {shown_url(url)}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(f"not an http(s) URL: {shown_url(url)}")
    if port == 0:
        raise InvalidArgument(f"port 0 in {shown_url(url)}")
    if any(c in url for c in "\r\n\t\0 "):
        raise InvalidArgument(f"a URL with spaces or control characters: {shown_url(url)}")
    # The one form rules, the allowlist and approvals compare (hosts.py):
    # 2130706433, 127.1 and [::ffff:127.0.0.1] are all 127.0.0.1.
    host = canonical_host(parts.hostname)
    if host is None:
        raise InvalidArgument(f"not a valid host name in {shown_url(url)}")
    return host


def port_of(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


_DETAIL_MAX = 1500


def describe(tool: str, args: Mapping[str, Any]) -> str:
    """What a held call would do, for the person answering: a web call's
    method, full URL, port, body size and the headers the agent set. Bounded;
    the client escapes it when it prints it."""
    if TOOLS.kind_of(tool) is not ToolKind.WEB:
        return ""
    url = str(args.get("url", ""))
    method = "POST" if tool == "http_post" else "GET"
    try:
        port = str(port_of(url))
    except ValueError:
        port = "?"
    parts = [f"{method} {url[:1000]}", f"port {port}"]
    if tool == "http_post":
        parts.append(f"body {len(str(args.get('body', '')).encode())} bytes")
    headers = dict(args.get("headers") or {})
    if headers:
        shown = ", ".join(f"{k[:40]}: {str(v)[:80]}" for k, v in list(headers.items())[:10])
        more = f" (+{len(headers) - 10} more)" if len(headers) > 10 else ""
        parts.append(f"headers {shown}{more}")
    return "; ".join(parts)[:_DETAIL_MAX]


def check_headers(url: str, headers: Mapping[str, str]) -> None:
    """Refuse headers that would make the request claim another host than the
    one the gate decided on (a shared front routes by Host: issue 21), HTTP/2
    pseudo-headers, and anything http.client would choke on or smuggle."""
    host = host_of(url)
    for name, value in headers.items():
        low = name.strip().lower()
        if not name or name.startswith(":") or low in (":authority", "host"):
            if low == "host" and _same_host(value, url, host):
                continue
            raise InvalidArgument(
                f"header {name[:40]!r}: the broker sets the host from the URL ({host}); "
                "a different one is refused"
            )
        if any(c in name for c in ":\r\n\0 \t") or any(c in value for c in "\r\n\0"):
            raise InvalidArgument(f"header {name[:40]!r}: control characters or a bad name")
        if low in ("content-length", "transfer-encoding", "connection"):
            raise InvalidArgument(f"header {name[:40]!r} is set by the broker")


def _same_host(value: str, url: str, host: str) -> bool:
    try:
        given = urlsplit("//" + value.strip())
        return (canonical_host(given.hostname or "") == host
                and given.port in (None, urlsplit(url).port))
    except ValueError:
        return False


def call_for(tool: str, args: Mapping[str, Any], workdir: str) -> Call:
    """The gate's view of a call. Paths are normalised lexically here; the
    real path of each opened file is checked again when it is opened."""
    validate(tool, args)
    kind = TOOLS.kind_of(tool)
    if kind in (ToolKind.READ, ToolKind.WRITE):
        if tool == "read_files":
            raw = list(args["paths"])
            if not raw:
                raise InvalidArgument("read_files: no paths")
        else:
            raw = [str(args.get("path") or ".")]
        paths = tuple(normalise(p, workdir) for p in raw)
        # The broker replaces these by the real paths it opens (resolve.py).
        return Call(tool, " ".join(paths), paths, requested=" ".join(map(str, raw)))
    if kind is ToolKind.WEB:
        url = str(args["url"])
        check_headers(url, dict(args.get("headers") or {}))
        host = host_of(url)
        return Call(tool, host, scope=f"{host}:{port_of(url)}", requested=url, host=host)
    if kind is ToolKind.SHELL:
        return Call(tool, str(args["command"]))
    if kind is ToolKind.CREDENTIAL:
        return Call(tool, str(args["name"]))
    if kind is ToolKind.GIT:
        where = git_target(str(args["url"]))
        return Call(tool, where, scope=where)
    if kind is ToolKind.SSH:
        host = str(args["host"])
        if len(host) > 300:
            # Refused, never cut: a rule must see the whole target.
            raise InvalidArgument(f"{tool}: a host of more than 300 characters")
        return Call(tool, host, scope=host)
    return Call(tool, "")
