"""`lev -H [USER@]HOST` and `lev -M MACHINE` (issue 46), with systemd's
meaning: the same command against the leviathd of another machine, over ssh
to its system bus, or of a local container, through `systemd-stdio-bridge`
as `systemctl -H` and `-M` do (sd-bus's unixexec transport: `ssh -xT --
HOST systemd-stdio-bridge`). The far bus learns who calls from the bridge's
own connection, the ssh login's user: that machine's polkit decides as for
a local caller, and nothing `lev` says about itself counts there.

ssh carries no file descriptors, so only the commands that pass none go
this way (REMOTE_COMMANDS); the others are refused before anything starts."""

from __future__ import annotations

REMOTE_COMMANDS = ("ps", "stop", "stats")
BRIDGE = "systemd-stdio-bridge"
_OPTIONS = {"-H": "host", "--host": "host", "-M": "machine", "--machine": "machine"}
MAX_TARGET = 255


class RemoteError(Exception):
    """A -H or -M target or command this cannot take; the text says why."""


def _target_ok(kind: str, value: str) -> bool:
    # What ssh and machinectl take as a name: no option (a leading "-" would
    # be one to ssh), no spaces, no control characters, no shell syntax
    # (ssh hands its remote command to a shell; the command here is fixed,
    # and the host is an argument, but a name that needs none of it is
    # refused anyway).
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@:[]")
    if kind == "machine":
        allowed -= set(":[]")
    return (0 < len(value) <= MAX_TARGET and not value.startswith("-")
            and set(value) <= allowed and value.count("@") <= 1)


def split(argv: list[str]) -> tuple[list[str], list[str] | None, str]:
    """(the rest of argv, the bridge's argv or None, what it reaches) for
    `-H X`, `--host X`, `--host=X`, `-M X`, `--machine X`, `--machine=X`
    given before the command."""
    if not argv:
        return argv, None, ""
    head = argv[0]
    name, eq, value = head.partition("=")
    if name in ("--host", "--machine") and eq:
        rest = argv[1:]
    elif head in _OPTIONS:
        if len(argv) < 2:
            raise RemoteError(f"{head} needs a {_OPTIONS[head]}")
        name, value, rest = head, argv[1], argv[2:]
    else:
        return argv, None, ""
    kind = _OPTIONS[name]
    if not _target_ok(kind, value):
        raise RemoteError(f"{value[:80]!r} is not a {kind} name")
    command = next((a for a in rest if not a.startswith("-")), None)
    if command not in REMOTE_COMMANDS:
        raise RemoteError(f"lev {name} takes {', '.join(REMOTE_COMMANDS)}, not "
                          f"{command!r}: ssh carries no file descriptors, which the others "
                          "pass")
    if kind == "host":
        return rest, ["ssh", "-xT", "--", value, BRIDGE], f"host {value}"
    return rest, [BRIDGE, f"--machine={value}"], f"machine {value}"
