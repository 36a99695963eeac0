"""The user's container registry logins at the egress (issue 49 item 3).

An agent's engine (its user's rootless podman, enginesock/rootless.py) pulls
through the agent's proxy. The user's registry logins stay outside: the
files that hold them (`~/.docker/config.json`, podman's
`$XDG_RUNTIME_DIR/containers/auth.json` and `~/.config/containers/auth.json`)
are hidden from the agent (hidden.py), and the daemon reads them as the user
(her file-system ids, by descriptor, no link followed, at most MAX_SIZE
bytes). Each registry host with a login becomes one injection of kind
"registry" for that host alone: the proxy ends TLS toward it with the
agent's CA (the engine trusts the agent's bundle), verifies the real
registry against the system's CAs, and puts `Authorization: Basic` into a
request that sent no Authorization of its own (proxy/inject.py). A header
the agent or its engine sent (a `docker login` done inside the agent, a
registry's bearer token) is kept as theirs.

Docker Hub-style token auth: the registry answers 401 with `WWW-Authenticate:
Bearer realm=...`, and the client asks the realm for a token. Where the realm
is on the registry's own host (ghcr.io, a plain registry with token auth)
the token request is the one that gets the Basic login; Docker Hub's realm
is auth.docker.io, which its logins cover too (DOCKER_HUB). A realm on any
other host gets nothing: the pull is then anonymous (docs/containers.md).

The value is read again from the files at each request that needs it
(`read_secret`): a login changed on the host, or a daemon restart, holds
for a running agent. Nothing of it is written anywhere.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from leviathd import fsat, fsids, userfiles
from leviathd.proxy import inject

KIND = "registry"
# Every injection name of a registry login starts so; a configured
# credential's name cannot hold "/" (config/models.py Name).
PREFIX = "registry/"
MAX_SIZE = 256 << 10
MAX_LOGINS = 64
MAX_VALUE = 4096

# Where podman looks, in its order, then docker's file (the first that has
# the host wins). The runtime one under /run/user/<uid>, as systemd makes it.
RUNTIME_AUTH = ("containers", "auth.json")
HOME_FILES: tuple[tuple[str, ...], ...] = ((".config", "containers", "auth.json"),
                                           (".docker", "config.json"))
# Docker Hub's names in a docker config, and where its logins go: the
# registry and its token realm.
DOCKER_HUB_KEYS = frozenset({"index.docker.io", "docker.io", "registry-1.docker.io",
                             "registry.hub.docker.com"})
DOCKER_HUB = ("registry-1.docker.io", "auth.docker.io")
_HOST = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?(:[0-9]{1,5})?$")


@dataclass
class Found:
    # host[:port] as the proxy covers it -> "user:password"; memory only.
    logins: dict[str, str] = field(default_factory=dict, repr=False)
    notes: list[str] = field(default_factory=list)


def host_of(key: str) -> str | None:
    """The registry's host[:port] from an `auths` key (`https://host/v1/`,
    `host:5000`, podman's `host/namespace`), None for anything else. A
    port of 443 is the default one (the proxy's patterns leave it out)."""
    rest = key.strip().lower()
    for scheme in ("https://", "http://"):
        rest = rest.removeprefix(scheme)
    host = rest.split("/", 1)[0].removesuffix(":443")
    if not _HOST.match(host) or ".." in host:
        return None
    name, _, port = host.partition(":")
    if port and not 0 < int(port) < 65536:
        return None
    return "docker.io" if name in DOCKER_HUB_KEYS else host


def hosts_for(host: str) -> tuple[str, ...]:
    """The hosts a login for `host` is injected toward."""
    return DOCKER_HUB if host == "docker.io" else (host,)


def _value(entry: object) -> str | None:
    """`user:password` from one `auths` entry: its base64 `auth`, or its
    `username` and `password`; None when it has neither (an identity token,
    or a login kept by a credential helper)."""
    if not isinstance(entry, dict):
        return None
    auth = entry.get("auth")
    value: str | None = None
    if isinstance(auth, str) and auth:
        try:
            value = base64.b64decode(auth, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            return None
    else:
        user, password = entry.get("username"), entry.get("password")
        if isinstance(user, str) and isinstance(password, str) and user and password:
            value = f"{user}:{password}"
    if (value is None or ":" not in value or value.startswith(":") or len(value) > MAX_VALUE
            or any(c in value for c in "\r\n\0")):
        return None
    return value


def parse(data: bytes, where: str, found: Found) -> None:
    """The logins of one auth file into `found` (hosts already there kept:
    the earlier file wins), with notes on what is not used."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        found.notes.append(f"{where}: not JSON; its registry logins are not used")
        return
    if not isinstance(doc, dict):
        found.notes.append(f"{where}: not a JSON object")
        return
    if doc.get("credsStore") or doc.get("credHelpers"):
        found.notes.append(f"{where}: logins kept by a credential helper (credsStore, "
                           "credHelpers) are not read: the daemon runs no helper program")
    auths = doc.get("auths")
    if not isinstance(auths, dict):
        return
    for key, entry in auths.items():
        host = host_of(str(key))
        value = _value(entry)
        if host is None or value is None:
            found.notes.append(f"{where}: the login for {str(key)[:100]!r} is not used "
                               "(not a registry host, or no user name and password)")
            continue
        if host not in found.logins and len(found.logins) < MAX_LOGINS:
            found.logins[host] = value


def _read(dir_fd: int, rel: tuple[str, ...], where: str, notes: list[str]) -> bytes | None:
    return userfiles.read_noted(dir_fd, rel, where, MAX_SIZE, notes)


def _own_dir(path: str, uid: int) -> int | None:
    """`path` opened (as the user), when it is her own folder."""
    try:
        fd = fsat.open_dir(path)
    except OSError:
        return None
    if os.fstat(fd).st_uid != uid:
        os.close(fd)
        return None
    return fd


def _files(uid: int, home: str, runtime: str) -> Iterator[tuple[int, tuple[str, ...], str]]:
    """(folder, path under it, name for notes) in podman's order; each
    folder closed after its files are read."""
    for base, rels, shown in ((runtime, (RUNTIME_AUTH,), "$XDG_RUNTIME_DIR"),
                              (home, HOME_FILES, "~")):
        fd = _own_dir(base, uid)
        if fd is None:
            continue
        try:
            for rel in rels:
                yield fd, rel, f"{shown}/{'/'.join(rel)}"
        finally:
            os.close(fd)


def read_logins(uid: int, gid: int, home: str, runtime: str | None = None) -> Found:
    """The user's registry logins, read as the user (in a worker thread)."""
    found = Found()
    with fsids.as_user(uid, gid):
        for fd, rel, where in _files(uid, home, runtime or f"/run/user/{uid}"):
            data = _read(fd, rel, where, found.notes)
            if data is not None:
                parse(data, where, found)
    return found


def injections(found: Found, key: bytes) -> tuple[inject.Injection, ...]:
    """One injection per registry host with a login, toward it alone."""
    out: list[inject.Injection] = []
    for host in sorted(found.logins):
        name = PREFIX + host
        out.append(inject.Injection(name=name, kind=KIND, hosts=hosts_for(host),
                                    placeholder=inject.placeholder(key, name)))
    return tuple(out)


def read_secret(name: str, uid: int, gid: int, home: str, runtime: str | None = None) -> str:
    """The login of injection `name`, read again from the user's files
    (in a worker thread)."""
    value = read_logins(uid, gid, home, runtime).logins.get(name.removeprefix(PREFIX))
    if not name.startswith(PREFIX) or value is None:
        raise LookupError("the registry login is not in the user's files now")
    return value
