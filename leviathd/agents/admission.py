"""Whether a start can run at all, asked before it is accepted (issue 46): a
start that passes polkit but cannot run would otherwise be answered with an
id whose agent ends at once (status 127: the fence could not join a keyring
of its own). Each refusal names the limit and the setting that moves it.

- The user's kernel key quota: the kernel's own figures for the uid, from
  /proc/key-users (keys held / kernel.keys.maxkeys, bytes held /
  kernel.keys.maxbytes), against what this start and the user's other
  starts under way will join (one session keyring each).
- The machine's cap on one user's running agents (`[limits]
  agents_per_user`), counted by the daemon.
- Subordinate ids, for an agent whose container engine is the user's own
  rootless podman (enginesock/rootless.py checks the same later, at its
  start; here it costs no fork, no scope)."""

from __future__ import annotations

import dataclasses

from leviathd.enginesock import rootless
from leviathd.errors import LeviathError
from leviathd.identity import UserInfo

KEY_USERS = "/proc/key-users"
MAXKEYS = "/proc/sys/kernel/keys/maxkeys"
MAXBYTES = "/proc/sys/kernel/keys/maxbytes"
# /proc/key-users has one short line per uid holding keys; bounded anyway.
MAX_KEY_USERS = 1 << 20
# What one start joins: the fence's (or the unsandboxed process's) session
# keyring, named "leviath-" and 16 hex digits (sandbox/privileges.py). The
# kernel charges a keyring its name and its NUL. A namespace agent's file
# worker joins a second one at its first file tool call: that one is not
# charged here (docs/operations.md, "How many agents").
KEYRINGS_PER_START = 1
BYTES_PER_KEYRING = len("leviath-") + 16 + 1


class Refused(LeviathError):
    """A start that cannot run, refused before it is accepted; the message
    names the limit and the setting."""

    dbus_name = "org.leviath.Error.LimitExceeded"


@dataclasses.dataclass(frozen=True)
class KeyUse:
    keys: int
    maxkeys: int
    bytes: int
    maxbytes: int


def _read(path: str, limit: int) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read(limit)


def parse_key_users(text: str, uid: int) -> KeyUse | None:
    """The line of `uid` in /proc/key-users ("  UID:  USAGE NKEYS/NIKEYS
    QNKEYS/MAXKEYS QNBYTES/MAXBYTES"), or None when it holds no keys."""
    for line in text.splitlines():
        head, sep, rest = line.partition(":")
        if not sep or head.strip() != str(uid):
            continue
        fields = rest.split()
        if len(fields) != 4:
            return None
        try:
            keys, maxkeys = (int(x) for x in fields[2].split("/"))
            nbytes, maxbytes = (int(x) for x in fields[3].split("/"))
        except ValueError:
            return None
        return KeyUse(keys, maxkeys, nbytes, maxbytes)
    return None


def key_use(uid: int) -> KeyUse | None:
    """The kernel's figures for `uid`: its line, or nothing held against the
    sysctls (a uid that holds no key has no line). None where the kernel has
    no keys (then no keyring is joined either)."""
    try:
        got = parse_key_users(_read(KEY_USERS, MAX_KEY_USERS), uid)
        if got is not None:
            return got
        return KeyUse(0, int(_read(MAXKEYS, 64)), 0, int(_read(MAXBYTES, 64)))
    except (OSError, ValueError):
        return None


def check_keys(user: str, use: KeyUse | None, starting: int) -> None:
    """Refused when the user's key quota has no room for the keyrings of its
    `starting` starts under way (this one included)."""
    if use is None:
        return
    keys = use.keys + KEYRINGS_PER_START * starting
    nbytes = use.bytes + BYTES_PER_KEYRING * starting
    if keys > use.maxkeys or nbytes > use.maxbytes:
        raise Refused(
            f"user {user} is at the kernel's key quota ({use.keys} of {use.maxkeys} keys, "
            f"{use.bytes} of {use.maxbytes} bytes held; each running agent holds a keyring "
            "of its own): the agent would end at once, so it is not started. Stop agents, "
            "or raise the quota as root: sysctl -w kernel.keys.maxkeys=N kernel.keys.maxbytes=M "
            "(docs/operations.md, \"How many agents\")")


def check_cap(user: str, running: int, starting: int, cap: int | None) -> None:
    """Refused when the user's running agents and its other starts under way
    (`starting` counts this one) would pass the machine's cap."""
    if cap is not None and running + starting > cap:
        raise Refused(
            f"user {user} runs {running} agents (and has {starting - 1} other starts under way): "
            f"the machine allows {cap} running agents a user ([limits] agents_per_user in "
            "/etc/leviath/config.toml)")


def check_rootless_engine(user: UserInfo) -> None:
    """Refused when the user's own rootless podman cannot run (no subordinate
    ids, no newuidmap...): the message says what the admin must do."""
    try:
        rootless.preflight(user)
    except rootless.RootlessUnavailable as exc:
        raise Refused(f"the agent's container engine (rootless podman as {user.name}) cannot "
                      f"run here: {exc.strerror or exc}") from None
