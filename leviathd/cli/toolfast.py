"""`lev tool NAME ARG...` without argparse, json or re: shells and scripts
in an agent call tools this way, one process per call, so its start-up is
the call's cost (issue 18). It imports only sys, os and the C halves of
socket and json; any other form of the command (an option, --json, --help, a
tool with too many arguments, a broker that cannot be reached) returns None
and takes the full path in cli/tool.py, which behaves the same for the forms
handled here."""

from __future__ import annotations

import _json  # the C half of json: no re, no pure-Python scanner
import _socket  # the socket module's C half: no enum, selectors
import os
import sys

# typing imports re; mypy reads any TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULT_SOCKET = "/run/leviath/broker.sock"
# domain.tools.TOOLS reduced to what positional arguments need:
# (names in order, the variadic parameter, its type). A unit test keeps the
# two equal.
POSITIONAL: dict[str, tuple[tuple[str, ...], str | None, str | None]] = {
    "read_file": (("path",), None, None),
    "read_files": ((), "paths", "array"),
    "list_dir": (("path",), None, None),
    "write_file": (("path", "content"), None, None),
    "edit_file": (("path", "old", "new"), None, None),
    "shell": ((), "command", "string"),
    "web_fetch": (("url",), None, None),
    "http_get": (("url",), None, None),
    "http_post": (("url", "body"), None, None),
    "credential": (("name",), "args", "array"),
    "git_fetch": (("url",), None, None),
    "git_push": (("url",), None, None),
    "ssh_sign": (("host",), None, None),
}
# A broker reply is one line; the broker bounds what it sends, this bounds
# what we keep.
MAX_REPLY = 64 * 1024 * 1024


class _Ctx:
    """What _json.make_scanner reads from a json.JSONDecoder."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict[str, str] = {}  # noqa: RUF012 (the scanner's own cache)

    @staticmethod
    def parse_constant(name: str) -> float:
        return {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}[name]


_scan = _json.make_scanner(_Ctx())  # type: ignore[arg-type]


def loads(text: str) -> Any:
    text = text.strip()
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        raise ValueError("not JSON") from None
    if end != len(text):
        raise ValueError("extra data after JSON")
    return value


def dumps(value: Any) -> str:
    """Compact JSON for the few types a request holds."""
    if isinstance(value, str):
        return str(_json.encode_basestring_ascii(value))
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{dumps(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__}")


def positional_args(name: str, values: list[str]) -> dict[str, Any] | None:
    """As broker.schema.args_from_positional; None where that would refuse."""
    spec = POSITIONAL.get(name)
    if spec is None:
        return {"args": list(values)}
    names, variadic, kind = spec
    args: dict[str, Any] = dict(zip(names, values, strict=False))
    rest = values[len(names) :]
    if variadic is not None:
        if kind == "array":
            args[variadic] = rest
        elif rest:
            args[variadic] = " ".join(rest)
    elif rest:
        return None
    return args


def connect() -> _socket.socket | None:
    """The broker's socket, or None when it cannot be reached (cli/tool.py
    then says why, inside an agent or not)."""
    path = os.environ.get("LEVIATH_BROKER", DEFAULT_SOCKET)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def exchange(sock: _socket.socket, payload: dict[str, Any]) -> dict[str, Any]:
    """One request, one reply line; the socket is closed after."""
    try:
        try:
            sock.sendall(dumps({**payload, "id": 1}).encode() + b"\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # a refused peer: the broker said why and closed; read below
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                chunk = sock.recv(1 << 20)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if b"\n" in chunk or size > MAX_REPLY:
                break
    finally:
        sock.close()
    line = b"".join(chunks).split(b"\n", 1)[0]
    if not line:
        raise _Failed("the broker closed the connection")
    try:
        reply = loads(line.decode())
    except ValueError:  # UnicodeDecodeError is one too
        raise _Failed("the broker sent a reply that is not JSON") from None
    if not isinstance(reply, dict):
        raise _Failed("the broker sent something other than a JSON object")
    return reply


class _Failed(Exception):
    pass


def _fail(message: str) -> int:
    from leviathd.cli.text import field

    print(f"lev: {field(message)}", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int | None:
    """argv after `tool`; None when this form is not one handled here."""
    if not argv or any(a.startswith("-") for a in argv):
        return None
    name, values = argv[0], argv[1:]
    if name not in POSITIONAL:
        return None  # `list`, a blueprint's tool (its schema is the broker's): cli/tool.py
    args = positional_args(name, values)
    if args is None:
        return None
    sock = connect()
    if sock is None:
        return None
    if name == "write_file" and "content" not in args and "path" in args:
        args["content"] = sys.stdin.read()
    try:
        reply = exchange(sock, {"op": "call", "tool": name, "args": args})
    except _Failed as exc:
        return _fail(str(exc))
    if not reply.get("ok"):
        err = reply.get("error") or {}
        return _fail(f"{err.get('code', 'error')}: {err.get('message', 'refused')}")
    result = reply.get("result")
    if name == "read_file" and isinstance(result, dict) and "content" in result:
        sys.stdout.write(str(result["content"]))
    else:
        import json

        print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0
