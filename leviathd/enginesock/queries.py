"""The query strings the filtered engine socket passes, as allow-lists: for
each endpoint, the parameters the docker CLI and compose send and the value
each may take. The query the engine receives is serialised anew from the
parsed and checked pairs; a parameter not listed for its endpoint is refused
with its name (podman's `/build` reads `secrets`, `nsoptions`, `addcaps`,
`securityopt`, `devices`: none is listed, so none passes)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from leviathd.enginesock.refused import Refused

Check = Callable[[str, str], str]

_NAME = re.compile(r"^/?[A-Za-z0-9][A-Za-z0-9_.-]{0,254}\Z")
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,254}\Z")
_SIGNAL = re.compile(r"^[A-Za-z0-9+-]{1,20}\Z")
_PS_ARGS = re.compile(r"^[A-Za-z0-9 ,%-]{0,100}\Z")
_TIME = re.compile(r"^[0-9A-Za-z.:+-]{0,40}\Z")
_TAIL = re.compile(r"^(all|[0-9]{1,12})\Z")
_PLATFORM = re.compile(r"^[a-z0-9_/.-]{0,64}\Z")


def flag(name: str, value: str) -> str:
    if value.lower() not in ("", "0", "1", "true", "false"):
        raise Refused(f"the query parameter {name} is not a boolean", 400)
    return value


def number(name: str, value: str) -> str:
    if not re.match(r"^-?[0-9]{1,15}\Z", value):
        raise Refused(f"the query parameter {name} is not a number", 400)
    return value


def pattern(rx: re.Pattern[str]) -> Check:
    def check(name: str, value: str) -> str:
        if not rx.match(value):
            raise Refused(f"the query parameter {name} has a value the filtered socket does "
                          "not allow", 400)
        return value
    return check


def text(name: str, value: str) -> str:
    if len(value) > 4096 or any(ord(ch) < 0x20 for ch in value):
        raise Refused(f"the query parameter {name} is over 4096 characters or holds a "
                      "control character", 400)
    return value


def json_map(name: str, value: str) -> str:
    """A JSON object of strings (build args, labels), serialised anew."""
    if not value:
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        raise Refused(f"the query parameter {name} is not JSON", 400) from None
    if not isinstance(parsed, dict) or len(parsed) > 256 or not all(
            isinstance(k, str) and (v is None or isinstance(v, str)) and len(k) < 4096
            and (v is None or len(v) < 65536) for k, v in parsed.items()):
        raise Refused(f"the query parameter {name} is not a JSON object of strings", 400)
    return json.dumps(parsed)


def json_refs(name: str, value: str) -> str:
    if not value:
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        raise Refused(f"the query parameter {name} is not JSON", 400) from None
    if not isinstance(parsed, list) or len(parsed) > 64 or not all(
            isinstance(v, str) and _REF.match(v) for v in parsed):
        raise Refused(f"the query parameter {name} is not a JSON list of image names", 400)
    return json.dumps(parsed)


def filters(name: str, value: str) -> str:
    """Docker's filters (a map of lists, or of maps of true), as a map of lists."""
    if not value:
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        raise Refused("filters is not JSON", 400) from None
    if not isinstance(parsed, dict):
        raise Refused("filters is not a JSON object", 400)
    out: dict[str, list[str]] = {}
    for k, v in parsed.items():
        if isinstance(v, dict):  # the old form {"label": {"a=b": true}}
            out[str(k)] = [str(x) for x, on in v.items() if on]
        elif isinstance(v, list):
            out[str(k)] = [str(x) for x in v]
        else:
            raise Refused("filters has a value that is neither a list nor a map", 400)
    return json.dumps(out)


def dockerfile(name: str, value: str) -> str:
    """A Dockerfile inside the build context: relative, never leaving it."""
    parts = value.split("/")
    if value.startswith("/") or ".." in parts or "\\" in value or len(value) > 1024 or any(
            ord(ch) < 0x20 for ch in value):
        raise Refused(f"the Dockerfile {value[:100]!r} is not a path inside the build context")
    return value


def empty(*zeros: str) -> Check:
    """A parameter the docker CLI always sends, passed only at its zero."""
    def check(name: str, value: str) -> str:
        if value not in ("", *zeros):
            raise Refused(f"the query parameter {name} is not allowed (only empty)")
        return value
    return check


def version_one(name: str, value: str) -> str:
    if value not in ("", "1"):
        raise Refused("BuildKit's session is not filtered, so it is refused: build with "
                      "DOCKER_BUILDKIT=0")
    return value


def network_mode(name: str, value: str) -> str:
    if value not in ("", "default", "bridge", "none"):
        raise Refused(f"builds with --network {value[:40]} are not allowed")
    return value


def from_src(name: str, value: str) -> str:
    if value != "-":
        raise Refused("importing an image from a URL or path is not allowed")
    return value


NAME = pattern(_NAME)
REF = pattern(_REF)
SIGNAL = pattern(_SIGNAL)
TIME = pattern(_TIME)

_LOGS: dict[str, Check] = {
    "follow": flag, "stdout": flag, "stderr": flag, "since": TIME, "until": TIME,
    "timestamps": flag, "tail": pattern(_TAIL), "details": flag}
_ATTACH: dict[str, Check] = {
    "stream": flag, "stdin": flag, "stdout": flag, "stderr": flag, "logs": flag,
    "detachKeys": text}
_RESIZE: dict[str, Check] = {"h": number, "w": number}
_FILTERS: dict[str, Check] = {"filters": filters}

ALLOWED: dict[str, dict[str, Check]] = {
    "info": {},
    "containers/json": {"all": flag, "limit": number, "size": flag, "filters": filters,
                        "before": NAME, "since": NAME},
    "containers/create": {"name": NAME, "platform": pattern(_PLATFORM)},
    "containers/prune": _FILTERS,
    "containers/delete": {"v": flag, "force": flag},
    "containers/json-one": {"size": flag},
    "containers/start": {"detachKeys": text},
    "containers/stop": {"t": number, "signal": SIGNAL},
    "containers/restart": {"t": number, "signal": SIGNAL},
    "containers/kill": {"signal": SIGNAL},
    "containers/wait": {"condition": pattern(re.compile(r"^(not-running|next-exit|removed|)\Z"))},
    "containers/logs": _LOGS,
    "containers/attach": _ATTACH,
    "containers/attach/ws": _ATTACH,
    "containers/resize": _RESIZE,
    "containers/archive": {"path": text, "noOverwriteDirNonDir": flag, "copyUIDGID": flag},
    "containers/rename": {"name": NAME},
    "containers/stats": {"stream": flag, "one-shot": flag},
    "containers/top": {"ps_args": pattern(_PS_ARGS)},
    "containers/changes": {}, "containers/export": {}, "containers/pause": {},
    "containers/unpause": {}, "containers/exec": {},
    "exec/start": {}, "exec/resize": _RESIZE, "exec/json": {},
    "networks/list": _FILTERS, "networks/prune": _FILTERS, "networks/create": {},
    "networks/one": {"verbose": flag, "scope": pattern(re.compile(r"^(local|)\Z"))},
    "networks/delete": {}, "networks/connect": {}, "networks/disconnect": {},
    "volumes/list": _FILTERS, "volumes/prune": _FILTERS, "volumes/create": {},
    "volumes/one": {}, "volumes/delete": {"force": flag},
    "images/json": {"all": flag, "filters": filters, "digests": flag, "shared-size": flag},
    "images/create": {"fromImage": REF, "tag": pattern(re.compile(r"^[A-Za-z0-9_.:@-]{0,200}\Z")),
                      "platform": pattern(_PLATFORM), "fromSrc": from_src, "repo": REF,
                      "message": text, "changes": text},
    "build": {"dockerfile": dockerfile, "t": REF, "q": flag, "nocache": flag, "rm": flag,
              "forcerm": flag, "pull": text, "buildargs": json_map, "labels": json_map,
              "target": pattern(re.compile(r"^[A-Za-z0-9_.-]{0,128}\Z")),
              "networkmode": network_mode, "version": version_one, "cachefrom": json_refs,
              "shmsize": number, "memory": number, "memswap": number, "cpushares": number,
              "cpusetcpus": pattern(re.compile(r"^[0-9,-]{0,64}\Z")), "cpuperiod": number,
              "cpusetmems": pattern(re.compile(r"^[0-9,-]{0,64}\Z")),
              # The legacy builder's CLI sends these empty on every build.
              "cgroupparent": empty(), "ulimits": empty("[]", "null"),
              "extrahosts": empty(), "isolation": empty(), "session": empty(),
              "cpuquota": number, "platform": pattern(_PLATFORM), "squash": flag},
    "images/load": {"quiet": flag},
    "images/inspect": {}, "images/history": {}, "distribution": {},
    # `force` never passes: podman's forced removal also removes the containers
    # that use the image, another agent's among them.
    "images/delete": {"noprune": flag},
    "events": {"since": TIME, "until": TIME, "filters": filters},
    # podman --remote ps and images (libpod). `external` lists containers of
    # other tools in the storage (buildah's), which carry no labels.
    "libpod/containers/json": {"all": flag, "external": empty("false", "0"), "filters": filters,
                               "last": number, "limit": number, "namespace": flag,
                               "pod": flag, "size": flag, "sync": flag},
    "libpod/images/json": {"all": flag, "filters": filters},
}

# Parameters dropped rather than refused: the CLIs send them, and the request
# means the same without them as far as the agent's own things go.
DROPPED: dict[str, frozenset[str]] = {"images/delete": frozenset({"force"})}

MAX_REPEATS = {"t": 16, "changes": 64}


def rebuild(endpoint: str, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The query for `endpoint`, each pair checked, in the agent's order."""
    allowed = ALLOWED[endpoint]
    dropped = DROPPED.get(endpoint, frozenset())
    out: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for k, v in pairs:
        if k in dropped:
            continue
        check = allowed.get(k)
        if check is None:
            raise Refused(f"the query parameter {k[:60]!r} of {endpoint} is not one the "
                          "filtered socket knows, so the request is refused", 400)
        seen[k] = seen.get(k, 0) + 1
        if seen[k] > MAX_REPEATS.get(k, 1):
            raise Refused(f"the query parameter {k[:60]!r} is given too often", 400)
        out.append((k, check(k, v)))
    return out
