"""The Docker API's request bodies as the filtered socket knows them: a small
typed model of each body it passes, and `rebuild`, which parses what the
agent sent into that model and returns a NEW value holding only the model's
fields, each of its declared type and bounded. What the engine receives is
serialised from that value, never from the agent's bytes, so a field the
rules do not read (`Config.Volumes` turned into binds by podman's compat
layer, a new field of the next engine release) cannot reach the engine.
A field the model does not know is dropped when its value is a zero (null,
false, 0, "", [], {}, or lists and objects of zeros: what a newer client
sends for a setting its user did not touch), and refused with its name
otherwise.

Fields the docker CLI and compose always send, but whose only harmless value
is their zero (`Devices: []`, `OomKillDisable: false`, Windows' `CpuCount`),
are `Zero` fields: accepted and left out when zero, refused (with the reason)
otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from leviathd.enginesock.refused import Refused

MAX_STR = 64 * 1024
MAX_ITEMS = 1024
_INT64 = 2**63


@dataclass(frozen=True)
class Spec:
    """One field's type: str, int, bool, strs (a list of strings that may come
    as one string, Docker's StrSlice), list, map (string keys), obj, zero."""

    kind: str
    item: Spec | None = None
    fields: Mapping[str, Spec] = field(default_factory=dict)
    max: int = 0  # a string's length, a list's or map's items (0: the default)
    why: str = ""  # a zero field: why a value is refused


STR = Spec("str", max=4096)
LONG_STR = Spec("str", max=MAX_STR)
INT = Spec("int")
BOOL = Spec("bool")
STRS = Spec("strs", item=LONG_STR)


def strs(n: int = MAX_ITEMS, item: Spec = STR) -> Spec:
    return Spec("strs", item=item, max=n)


def list_of(item: Spec, n: int = MAX_ITEMS) -> Spec:
    return Spec("list", item=item, max=n)


def map_of(item: Spec, n: int = MAX_ITEMS) -> Spec:
    return Spec("map", item=item, max=n)


def obj(**fields: Spec) -> Spec:
    return Spec("obj", fields=fields)


def zero(why: str) -> Spec:
    return Spec("zero", why=why)


EMPTY = obj()  # `{}`: the value of ExposedPorts' and Volumes' keys


def is_zero(value: object) -> bool:
    return value is None or value is False or value == 0 or value in ("", [], {}) or (
        isinstance(value, list) and all(is_zero(v) for v in value)) or (
        isinstance(value, dict) and all(is_zero(v) for v in value.values()))


def _name(where: str) -> str:
    return where or "the request body"


def rebuild(value: Any, spec: Spec, where: str = "") -> Any:
    """`value` as the model's new value (None: absent), or Refused naming the
    first field that is unknown, of another type, out of bounds, or a zero
    field that is not zero."""
    if value is None:
        return None
    kind = spec.kind
    if kind == "zero":
        if is_zero(value):
            return None
        raise Refused(f"{_name(where)} is not allowed: {spec.why}")
    if kind == "str":
        if not isinstance(value, str):
            raise Refused(f"{_name(where)} is not a string", 400)
        if len(value) > (spec.max or MAX_STR) or "\0" in value:
            raise Refused(f"{_name(where)} is over {spec.max or MAX_STR} characters or holds "
                          "a NUL", 400)
        return str(value)
    if kind == "int":
        if type(value) is not int or not -_INT64 <= value < _INT64:
            raise Refused(f"{_name(where)} is not a 64-bit integer", 400)
        return int(value)
    if kind == "bool":
        if type(value) is not bool:
            raise Refused(f"{_name(where)} is not true or false", 400)
        return bool(value)
    assert spec.item is not None or kind == "obj", spec
    if kind == "strs" and isinstance(value, str):
        value = [value]
    if kind in ("strs", "list"):
        if not isinstance(value, list):
            raise Refused(f"{_name(where)} is not a list", 400)
        if len(value) > (spec.max or MAX_ITEMS):
            raise Refused(f"{_name(where)} has over {spec.max or MAX_ITEMS} items", 400)
        assert spec.item is not None
        out = [rebuild(v, spec.item, f"{where}[{i}]") for i, v in enumerate(value)]
        return [v for v in out if v is not None]
    if not isinstance(value, dict):
        raise Refused(f"{_name(where)} is not an object", 400)
    if kind == "map":
        if len(value) > (spec.max or MAX_ITEMS):
            raise Refused(f"{_name(where)} has over {spec.max or MAX_ITEMS} entries", 400)
        assert spec.item is not None
        got: dict[str, Any] = {}
        for k, v in value.items():
            key = rebuild(k, STR, f"{where} key")
            item = rebuild(v, spec.item, f"{where}[{str(k)[:60]!r}]")
            got[key] = "" if item is None and spec.item.kind == "str" else (
                {} if item is None else item)
        return got
    assert kind == "obj", spec
    made: dict[str, Any] = {}
    for k, v in value.items():
        path = f"{where}.{k}" if where else str(k)
        sub = spec.fields.get(k)
        if sub is None:
            if is_zero(v):
                # Each client release adds fields it sends at their zero
                # (docker 28's EndpointsConfig.*.GwPriority): the engine reads
                # an absent field as that zero, and the rebuilt request never
                # carries it, so dropping it changes nothing.
                continue
            raise Refused(f"{path[:120]} is not a field the filtered socket knows, and its "
                          f"value is not the zero that would change nothing, so the request "
                          "is refused", 400)
        item = rebuild(v, sub, path)
        if item is not None:
            made[k] = item
    return made


def paths(spec: Spec, where: str = "") -> set[str]:
    """Every field path of the model (maps and lists as `*`), for tests."""
    if spec.kind == "obj":
        out = {where} if where else set()
        for k, sub in spec.fields.items():
            out |= paths(sub, f"{where}.{k}" if where else k)
        return out
    if spec.kind in ("list", "strs", "map") and spec.item is not None:
        return {where} | paths(spec.item, f"{where}.*")
    return {where}


def field_names(*specs: Spec) -> frozenset[str]:
    """The names of every object field in `specs` (not map keys: data)."""
    out: set[str] = set()
    todo = list(specs)
    while todo:
        spec = todo.pop()
        out |= set(spec.fields)
        todo += list(spec.fields.values())
        if spec.item is not None:
            todo.append(spec.item)
    return frozenset(out)
