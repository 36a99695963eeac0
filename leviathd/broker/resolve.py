"""What a call will really touch, found before the gate decides, so rules
and the gate decide on facts rather than on what the agent typed.

- File tools: each path is opened as the agent's user (the opener, by
  descriptor) and the real path of the opened descriptor replaces the
  requested one in `call.paths`/`call.target`: a workdir link `notes.txt ->
  server.pem` is judged as server.pem. The run then accepts only descriptors
  whose real path is one the gate decided on (FileTools.decided), so a link
  swapped between the two opens is refused, never read.
- Web tools: the canonical host is resolved once and every address checked
  (net.resolve_checked); the first is `call.address`, and the request dials
  exactly that address. The broker resolves only a call the gate would let
  go without its address (core.Broker.decide), so a name never reaches a
  resolver for a call that is refused.

A path that cannot be opened (missing, refused) keeps its lexical form: the
run fails on it as it would have, and a file created there meanwhile has
another real path only if a link leads elsewhere, which the run refuses.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from leviathd.broker import net
from leviathd.broker.opener import Opener, OpenFailed
from leviathd.broker.schema import port_of
from leviathd.broker.tools import reader, refuse_several_names
from leviathd.errors import InvalidArgument
from leviathd.hosts import canonical_host
from leviathd.policy.decision import Call, normalise
from leviathd.policy.readgrant import GrantIndex
from leviathd.policy.tooldef import ToolDef, check_args, command_line, declared, render

READ_FLAGS = os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK


def _real(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _opened(opener: Opener, path: str, flags: int) -> tuple[str, os.stat_result] | None:
    """The real path and status of what `path` opens as the user, None if
    it does not open."""
    try:
        fd = opener.open(path, flags)
    except OpenFailed:
        return None
    try:
        return _real(fd), os.fstat(fd)
    finally:
        os.close(fd)


def _opened_real(opener: Opener, path: str, flags: int) -> str | None:
    got = _opened(opener, path, flags)
    return None if got is None else got[0]


def real_read_path(opener: Opener, index: GrantIndex, path: str, *, directory: bool,
                   outside: Opener | None = None, one_name: bool = False) -> str:
    """`outside`: for granted read paths outside the workdir (tools.reader).
    `one_name`: refuse a file with several names (a blueprint tool's path,
    which no later descriptor check of ours guards: tools.refuse_several_names)."""
    if not index.may_read(path):
        # Outside what the agent may read as written: the gate refuses it on
        # these words, as before, and nothing there is opened first (a
        # device's open can do things).
        return path
    opener = reader(opener, outside, index.workdir, path)
    got = _opened(opener, path, READ_FLAGS | (os.O_DIRECTORY if directory else 0))
    if got is None:
        return path
    real, st = got
    # Where the agent may not read, the run refuses with the one message
    # that tells nothing of what lies behind: the gate sees the lexical path.
    if not index.may_read(real):
        return path
    if one_name:
        refuse_several_names(st, path)
    return real


def real_write_path(opener: Opener, index: GrantIndex, path: str) -> str:
    """The real folder the file would be written in, and its name (the run
    opens the name with O_NOFOLLOW, so a link there is refused anyway)."""
    parent, name = os.path.split(path)
    if not index.may_write(path):
        return path  # refused on these words by the gate, as before
    real = _opened_real(opener, parent or ".", os.O_RDONLY | os.O_DIRECTORY)
    if real is None:
        return path
    return os.path.join(real, name) if index.may_write(real) else path


def file_call(call: Call, opener: Opener, index: GrantIndex, *, write: bool,
              outside: Opener | None = None) -> Call:
    """`call` with the real paths of what it reads or writes. Blocking."""
    if write:
        reals = tuple(real_write_path(opener, index, p) for p in call.paths)
    else:
        directory = call.tool == "list_dir"
        reals = tuple(real_read_path(opener, index, p, directory=directory, outside=outside)
                      for p in call.paths)
    return replace(call, target=" ".join(reals), paths=reals)


def blueprint_call(own: ToolDef, args: Mapping[str, Any], workdir: str) -> Call:
    """A blueprint tool's call: its whole command line as the target, the
    arguments it declares paths (normalised; real ones from file_call) and
    the canonical host of the first it declares a URL or host."""
    checked = check_args(own, args)
    paths = tuple(normalise(p, workdir) for p in declared(own, checked, "path"))
    hosts: list[str] = []
    for value in declared(own, checked, "url"):
        try:
            name = urlsplit(value).hostname or ""
        except ValueError:
            name = ""
        hosts.append(name)
    hosts += declared(own, checked, "host")
    host = ""
    if hosts:
        found = canonical_host(hosts[0])
        if found is None:
            raise InvalidArgument(f"{own.name}: no valid host in its URL or host argument")
        host = found
    return Call(own.name, command_line(render(own, checked)), paths, host=host,
                requested=" ".join(declared(own, checked, "path")))


def blueprint_paths(call: Call, opener: Opener, index: GrantIndex,
                    outside: Opener | None = None) -> Call:
    """The real paths of its declared path arguments. Blocking."""
    reals = tuple(real_read_path(opener, index, p, directory=False, outside=outside,
                                 one_name=True)
                  for p in call.paths)
    return replace(call, paths=reals)


def blueprint_address(call: Call) -> Call:
    """The address its declared host has for the host's resolver (the tool
    resolves for itself in its fence, so this is what a rule can know, not
    a pin); "" when it does not resolve. Blocking."""
    try:
        infos = socket.getaddrinfo(call.host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        infos = []
    address = (canonical_host(str(infos[0][4][0]).split("%")[0]) or "") if infos else ""
    return replace(call, address=address)


def web_call(call: Call, args: Mapping[str, Any], *, allow_private: bool) -> Call:
    """`call` with the address its request will dial. Blocking (the
    resolver); raises AddressRefused or InvalidArgument as the request would."""
    port = port_of(str(args["url"]))
    _family, address = net.resolve_checked(call.host, port, allow_private=allow_private)[0]
    return replace(call, address=canonical_host(address) or address)
