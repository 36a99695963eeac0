"""The one boundary for strings the daemon hands to systemd and journald.

systemd writes a transient unit's properties (Description above all) into
/run/systemd/transient/<unit> without escaping and parses that file again at
every daemon-reload; journald's stream protocol is a header of newline-ended
lines. A newline in anything a user chose (an agent name taken from argv[0],
a path, a tool's target) would become configuration in either. So every such
string passes through here: names are reduced to the blueprint name rules,
free text is refused or escaped when it holds control characters, and
everything is bounded. Nothing else in the daemon builds a unit name, a
Description or a journal stream header.
"""

from __future__ import annotations

import re
import unicodedata

from leviathd.errors import InvalidArgument

# The blueprint name rule (config/models.py `Name`): what agent names follow,
# whether they come from a blueprint or from argv[0]. Here always fullmatch:
# `$` also matches before a final newline, which match() would let through.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
NAME_MAX = 64
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]+")
_UNIT_PART = re.compile(r"[^A-Za-z0-9_.]")
# systemd's UNIT_NAME_MAX is 256 with the NUL.
UNIT_NAME_MAX = 255
_UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\-]+\.(scope|service|slice)$")
DESCRIPTION_MAX = 200
IDENTIFIER_MAX = 64
FIELD_MAX = 8192
FALLBACK_NAME = "agent"
# What journald records agents' output under: chosen here, never by the agent,
# so an agent cannot pose as sshd or leviathd in `journalctl -t`.
AGENT_IDENTIFIER = "leviath-agent"


def _is_control(ch: str) -> bool:
    # Cc: C0/C1 controls (newline, ESC, ...); Cf: bidi overrides and other
    # invisible format characters; Zl/Zp: the Unicode line and paragraph
    # separators some parsers treat as newlines; Cs: lone surrogates, what
    # invalid UTF-8 becomes under surrogateescape.
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs")


def has_control(text: str) -> bool:
    return any(_is_control(ch) for ch in text)


def agent_name(argv0: str) -> str:
    """The agent name of a command: argv[0]'s last part reduced to the
    blueprint name rules (anything else becomes '-'), bounded; "agent" when
    nothing is left. Never refuses: `lev run -- python3.12 x` must still run."""
    base = argv0.rsplit("/", 1)[-1]
    if NAME_RE.fullmatch(base):
        return base
    name = _NOT_NAME.sub("-", base).lstrip("-_")[:NAME_MAX].rstrip("-")
    return name if name and NAME_RE.fullmatch(name) else FALLBACK_NAME


def check_name(name: str) -> str:
    """A name that must already follow the rules (a blueprint's)."""
    if not NAME_RE.fullmatch(name):
        raise InvalidArgument(f"{escape(name, 80)} is not a valid agent name")
    return name


def unit_name(user: str, agent: str, agent_id: str) -> str:
    """leviath-<user>-<agent>-<id>.scope, from parts reduced to unit-name
    characters and bounded, so systemd never refuses it or reads more into it."""
    u = _UNIT_PART.sub("_", user)[:64]
    a = _UNIT_PART.sub("_", agent)[:NAME_MAX]
    i = _UNIT_PART.sub("_", agent_id)[:32]
    return check_unit_name(f"leviath-{u}-{a}-{i}.scope")


def check_unit_name(name: str) -> str:
    if len(name) > UNIT_NAME_MAX or not _UNIT_NAME.fullmatch(name):
        raise InvalidArgument(f"{escape(name, 80)} is not a unit name the daemon makes")
    return name


def text(value: str, *, what: str, limit: int) -> str:
    """Free text for a unit property: refused when it holds a control
    character, cut to `limit` characters."""
    if has_control(value):
        raise InvalidArgument(f"{what} holds a control character: {escape(value, 80)}")
    return value if len(value) <= limit else value[: limit - 1] + "…"


def description(value: str) -> str:
    return text(value, what="unit description", limit=DESCRIPTION_MAX)


def escape(value: str, limit: int = FIELD_MAX) -> str:
    """`value` with every control character written as a Python escape
    (\\n, \\x1b, \\u202e, a lone surrogate as \\udcff), cut to `limit`: safe
    for a journal message, a header line or a terminal."""
    if not has_control(value) and len(value) <= limit:
        return value
    out = "".join(
        ch.encode("unicode_escape", "backslashreplace").decode("ascii") if _is_control(ch) else ch
        for ch in value
    )
    return out if len(out) <= limit else out[: limit - 1] + "…"


def stream_header(*, identifier: str, unit: str, priority: int) -> bytes:
    """journald's stdout stream header: identifier, unit, priority, level
    prefix, forward to syslog / kmsg / console. Each line is checked, so no
    value can add or shift a line; the level prefix is off, so an agent's
    "<0>" at the start of a line stays text and never sets the priority."""
    if not 0 <= priority <= 7:
        raise InvalidArgument(f"journal priority {priority} is out of range")
    ident = text(identifier, what="journal identifier", limit=IDENTIFIER_MAX)
    if unit:
        check_unit_name(unit)
    lines = [ident, unit, str(priority), "0", "0", "0", "0"]
    return ("".join(f"{line}\n" for line in lines)).encode("utf-8")


_FIELD_NAME = re.compile(r"^[A-Z0-9][A-Z0-9_]{0,63}$")


def journal_fields(message: str, fields: dict[str, object]) -> dict[str, str]:
    """MESSAGE and the extra fields of a structured entry: names as journald
    requires (upper case, digits, '_', not starting with '_': the trusted
    fields are journald's own), values escaped and bounded. None is left out."""
    out = {"MESSAGE": escape(message)}
    for key, value in fields.items():
        if value is None:
            continue
        name = key.upper()
        if not _FIELD_NAME.fullmatch(name) or name in ("MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER"):
            raise ValueError(f"{name!r} is not a field name the daemon may set")
        out[name] = escape(str(value))
    return out


def utf8(data: bytes, *, what: str, limit: int) -> str:
    """Bytes that must be valid UTF-8 without control characters."""
    try:
        value = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"{what} is not valid UTF-8") from None
    return text(value, what=what, limit=limit)
