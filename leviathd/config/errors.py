"""Turn TOML and validation failures into messages a person can act on.

Each problem becomes one line, compiler style: `FILE:LINE: KEY: what is wrong`. tomllib
gives a line for syntax errors; for schema errors the line is found by scanning the text
for the key (tables, dotted keys and arrays of tables), which is good enough to point at
the right place and never raises. No traceback ever reaches the user.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from leviathd.errors import ConfigError

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_TOML_POS = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_TOML_EOF = re.compile(r"\s*\(at end of document\)\s*$")

Loc = Sequence[int | str]


def dotted(loc: Loc) -> str:
    """("sandbox", "mounts", 0, "access") -> "sandbox.mounts[0].access"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        key = part if _BARE_KEY.match(part) else '"' + part.replace('"', '\\"') + '"'
        out += ("." if out else "") + key
    return out


def toml_error(exc: tomllib.TOMLDecodeError, source: str) -> ConfigError:
    msg = str(exc)
    m = _TOML_POS.search(msg)
    if m:
        where = f"{source}:{m.group(1)}"
        msg = msg[: m.start()]
    else:
        eof = _TOML_EOF.search(msg)
        where = source
        if eof:
            msg = msg[: eof.start()] + " (at the end of the file)"
    return ConfigError(f"{where}: not valid TOML: {msg[:1].lower()}{msg[1:]}")


# ------------------------------------------------------------------ finding the line

_HEADER = re.compile(r"^\s*(\[\[?)\s*(.+?)\s*(\]\]?)\s*(#.*)?$")
_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')"""
_KEYVAL = re.compile(rf"^\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*=")


def _split_key(key: str) -> list[str]:
    parts = re.findall(r"\"([^\"]*)\"|'([^']*)'|([A-Za-z0-9_-]+)", key)
    return [a or b or c for a, b, c in parts]


def _line_paths(text: str) -> list[tuple[int, list[int | str]]]:
    """(line number, full key path) for every table header and key in `text`."""
    out: list[tuple[int, list[int | str]]] = []
    table: list[int | str] = []
    aot_count: dict[tuple[str, ...], int] = {}
    in_multiline = False
    for lineno, line in enumerate(text.splitlines(), start=1):
        # Skip the inside of multi-line strings (roughly: an odd number of """ or ''').
        quotes = line.count('"""') + line.count("'''")
        if in_multiline:
            if quotes % 2 == 1:
                in_multiline = False
            continue
        if quotes % 2 == 1:
            in_multiline = True
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        header = _HEADER.match(line)
        if header and header.group(1) == header.group(3)[::-1].replace("]", "["):
            names = _split_key(header.group(2))
            if header.group(1) == "[[":
                key = tuple(names)
                idx = aot_count.get(key, -1) + 1
                aot_count[key] = idx
                table = [*names, idx]
            else:
                table = list(names)
                # A sub-table of the latest [[array]] element, e.g. [allowlist.x].
                for key, idx in aot_count.items():
                    if tuple(names[: len(key)]) == key and len(names) > len(key):
                        table = [*key, idx, *names[len(key) :]]
            out.append((lineno, table))
            continue
        kv = _KEYVAL.match(line)
        if kv:
            out.append((lineno, [*table, *_split_key(kv.group(1))]))
    return out


def find_line(text: str, loc: Loc) -> int | None:
    """The line that best matches a key path: the deepest common prefix wins."""
    want = [str(p) for p in loc]
    best: tuple[int, int] | None = None  # (score, line)
    for lineno, path in _line_paths(text):
        have = [str(p) for p in path]
        score = 0
        for a, b in zip(have, want, strict=False):
            if a != b:
                break
            score += 1
        if score == 0 or score < len(have):
            continue  # only a line whose key is a prefix of the wanted key
        if best is None or score > best[0]:
            best = (score, lineno)
    return best[1] if best else None


# -------------------------------------------------------------- validation messages


def _model_at(model: type[BaseModel], loc: Loc) -> Any:
    """The model class the schema expects at `loc` (None when it is not a model)."""
    current: Any = model
    for part in loc:
        is_model = isinstance(current, type) and issubclass(current, BaseModel)
        if isinstance(part, int) or not is_model:
            return None
        field = current.model_fields.get(part)
        if field is None:
            return None
        current = _model_in(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _allowed_keys(model: type[BaseModel], loc: Loc) -> list[str]:
    """The keys the schema allows next to an unknown key at `loc`, for "did you mean"."""
    found = _model_at(model, loc[:-1])
    return list(found.model_fields) if found is not None else []


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _model_in(annotation: Any) -> Any:
    # Unwrap `X | None` and `list[X]` far enough to find a nested model, if any.
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _describe(err: dict[str, Any], model: type[BaseModel]) -> str:
    kind = err["type"]
    loc = err["loc"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, loc)
        hint = ""
        if loc and isinstance(loc[-1], str):
            close = difflib.get_close_matches(loc[-1], allowed, n=1)
            if close:
                hint = f" (did you mean {close[0]!r}?)"
        return "unknown key" + hint
    if kind == "missing":
        if _model_at(model, loc) is not None:
            return "required table is missing"
        return "required key is missing"
    if kind == "enum":
        expected = err.get("ctx", {}).get("expected", "")
        return f"must be {expected}, not {_short(err['input'])}"
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    elif msg.startswith("Assertion failed, "):
        msg = msg[len("Assertion failed, ") :]
    else:
        msg = msg[:1].lower() + msg[1:]
        if "input" in err and kind not in ("model_type", "dict_type", "list_type"):
            msg += f" (got {_short(err['input'])})"
        elif kind in ("model_type", "dict_type"):
            msg = "must be a table"
        elif kind == "list_type":
            msg = "must be an array"
    return msg


def validation_error(
    exc: ValidationError, source: str, text: str, model: type[BaseModel]
) -> ConfigError:
    return ConfigError("\n".join(_lines(exc.errors(), source, text, model)))


def _lines(errors: Iterable[Any], source: str, text: str, model: type[BaseModel]) -> list[str]:
    out: list[str] = []
    for err in errors:
        loc = [p for p in err["loc"] if isinstance(p, int | str)]
        line = find_line(text, loc) if loc else None
        where = f"{source}:{line}" if line else source
        key = dotted(loc) if loc else "(top level)"
        out.append(f"{where}: {key}: {_describe(err, model)}")
    return out
