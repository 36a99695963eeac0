"""Blueprint tools (`[tools.NAME]`): a fixed argv template, a JSON Schema of
its arguments, the label of its output and whether it can send data out.

Pure: checking a definition (at load, and again from a snapshot), checking
one call's arguments against its schema, and building the argv. The broker
runs the argv in the agent's own fence (gate_service.run_tool), never here.

The schema language is a bounded subset of JSON Schema: an object of at most
MAX_PROPERTIES scalar properties (string, integer, number, boolean) with
`description`, `enum`, `default`, `minLength`/`maxLength`,
`minimum`/`maximum`; `required`; `additionalProperties` may only be false
(the default here). `pattern` is refused: Python's regular expressions have
no cost bound, and a schema comes from a blueprint, i.e. from anyone.

Substitution: a template element holds at most one placeholder `{name}`; the
argument's value replaces it inside that one element, so a value never
becomes a second argument (no shell, no splitting). An element that starts
with a placeholder and comes before a literal `--` element would turn a value
starting with '-' into an option: such a value is refused there. After `--`,
or behind a literal prefix (`--pattern={p}`), it is passed as it is. A
placeholder of an argument the call left out (and that has no default)
drops its element.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from leviathd.domain.permission import Permission
from leviathd.domain.sensitivity import Label, Sensitivity
from leviathd.domain.tools import TOOLS, Registry, SendsOut, Tool, ToolKind
from leviathd.errors import InvalidArgument

MAX_PROPERTIES = 32
MAX_ENUM = 64
MAX_STRING = 4096  # a string argument's length when the schema sets no smaller maxLength
MAX_ARGV = 64
MAX_ELEMENT = 4096
MAX_DESCRIPTION = 500
MAX_TIMEOUT = 300
DEFAULT_TIMEOUT = 60
MAX_TOOLS = 32
SCALARS = ("string", "integer", "number", "boolean")
_PROP_KEYS = frozenset({"type", "description", "enum", "default", "minLength", "maxLength",
                        "minimum", "maximum", "title", "format"})
# A string argument's declared meaning, for the gate (docs/configuration.md):
# "path" is a file the tool reads (rules see its real path and
# call.kind == "read"), "url"/"host" where it connects (rules see the
# canonical host and the address it resolves to).
FORMATS = ("path", "url", "host")
_TOP_KEYS = frozenset({"type", "properties", "required", "additionalProperties",
                       "description", "title", "$schema"})
_PROP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
TOOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
# Words `lev tool` itself uses: a tool of that name could not be called.
RESERVED = frozenset({"list"})
SEPARATOR = "--"
_SHOWN = 80


class ToolDefError(ValueError):
    """A `[tools.NAME]` that cannot be used; the message says what to change."""


@dataclass(frozen=True)
class ToolDef:
    """One checked `[tools.NAME]`. Built by `make_tool`; read back from a gate
    snapshot by pydantic, which runs `__post_init__`: a definition the checks
    no longer pass does not come back."""

    name: str
    description: str
    schema: Mapping[str, Any]  # as checked: type object, properties, required
    argv: tuple[str, ...]
    output: Label = Sensitivity.INTERNAL
    sends_data: bool = False
    timeout: int = DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        if not TOOL_NAME.fullmatch(self.name) or len(self.description) > MAX_DESCRIPTION:
            raise ToolDefError(f"tool {_shown(self.name)}: not a valid definition")
        if check_schema(self.schema) != self.schema:
            raise ToolDefError(f"tool {self.name}: its schema is not as checked")
        check_template(self.argv, self.schema)
        if not 1 <= self.timeout <= MAX_TIMEOUT:
            raise ToolDefError(f"tool {self.name}: timeout: 1..{MAX_TIMEOUT} seconds")

    def input_schema(self) -> dict[str, Any]:
        """What MCP's tools/list offers."""
        return {**self.schema, "additionalProperties": False}

    @property
    def properties(self) -> Mapping[str, Mapping[str, Any]]:
        props: Mapping[str, Mapping[str, Any]] = self.schema.get("properties") or {}
        return props

    def registered(self) -> Tool:
        """As the tool registry holds it for this blueprint's agents: run in
        the agent's sandbox, its declared label, outbound (clearance Internal
        unless a config lowers it) when it says so or its fence has a network,
        allowed unless a config or the blueprint says otherwise."""
        return Tool(
            self.name, self.description, (), ToolKind.BLUEPRINT, self.output,
            SendsOut.ALWAYS if self.sends_data else SendsOut.WITH_NETWORK,
            Sensitivity.INTERNAL, Permission.ALLOW, schema=self.input_schema(),
        )


def with_blueprint_tools(tools: Iterable[ToolDef], base: Registry = TOOLS) -> Registry:
    """The registry an agent of this blueprint sees: the built-in tools and
    its own. A name a built-in tool has was refused at load; a snapshot's is
    left out here, never let to replace the built-in one."""
    return base.with_tools(*(t.registered() for t in tools if base.find(t.name) is None))


def _shown(value: object) -> str:
    text = str(value)
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")


def check_name(name: str, builtin: Registry = TOOLS) -> str:
    if not TOOL_NAME.fullmatch(name):
        raise ToolDefError(f"tool name {_shown(name)}: a letter, then letters, digits, '_' "
                           "or '-' (at most 64)")
    if builtin.find(name) is not None or name in RESERVED:
        raise ToolDefError(f"tool name {name!r} is taken by a built-in tool or by lev tool "
                           "itself; a blueprint tool cannot replace it")
    return name


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return (_is_int(v) or isinstance(v, float)) and v == v and v not in (
        float("inf"), float("-inf"))


def _type_ok(kind: str, v: object) -> bool:
    if kind == "string":
        return isinstance(v, str)
    if kind == "integer":
        return _is_int(v)
    if kind == "number":
        return _is_number(v)
    return isinstance(v, bool)


def _check_property(name: str, prop: object) -> dict[str, Any]:
    where = f"arguments.properties.{name}"
    if not isinstance(prop, Mapping):
        raise ToolDefError(f"{where}: must be a table (a JSON Schema)")
    unknown = sorted(set(prop) - _PROP_KEYS)
    if "pattern" in unknown:
        raise ToolDefError(f"{where}: 'pattern' is not supported (a regular expression's cost "
                           "has no bound); use enum, maxLength or a policy rule")
    if unknown:
        raise ToolDefError(f"{where}: unsupported keyword(s) {', '.join(map(repr, unknown))}; "
                           f"supported: {', '.join(sorted(_PROP_KEYS))}")
    kind = prop.get("type")
    if kind not in SCALARS:
        raise ToolDefError(f"{where}: type must be one of {', '.join(SCALARS)} (a value "
                           "becomes exactly one argument)")
    out: dict[str, Any] = {"type": kind}
    if "format" in prop:
        if kind != "string" or prop["format"] not in FORMATS:
            raise ToolDefError(f"{where}.format: for a string, one of {', '.join(FORMATS)}")
        out["format"] = prop["format"]
    for key in ("description", "title"):
        if key in prop:
            text = prop[key]
            if not isinstance(text, str) or len(text) > MAX_DESCRIPTION:
                raise ToolDefError(f"{where}.{key}: a string of at most {MAX_DESCRIPTION}")
            out[key] = text
    for key in ("minLength", "maxLength"):
        if key in prop:
            if kind != "string" or not _is_int(prop[key]) or not 0 <= prop[key] <= MAX_STRING:
                raise ToolDefError(f"{where}.{key}: for a string, a whole number 0..{MAX_STRING}")
            out[key] = prop[key]
    for key in ("minimum", "maximum"):
        if key in prop:
            if kind not in ("integer", "number") or not _is_number(prop[key]):
                raise ToolDefError(f"{where}.{key}: for a number, a number")
            out[key] = prop[key]
    if "enum" in prop:
        enum = prop["enum"]
        if (not isinstance(enum, list) or not 1 <= len(enum) <= MAX_ENUM
                or not all(_type_ok(kind, v) for v in enum)):
            raise ToolDefError(f"{where}.enum: 1..{MAX_ENUM} values of type {kind}")
        out["enum"] = list(enum)
    if "default" in prop:
        out["default"] = prop["default"]
        try:
            _check_value(name, out, prop["default"])
        except InvalidArgument as exc:
            raise ToolDefError(f"{where}.default: {exc}") from None
    return out


def check_schema(schema: object) -> dict[str, Any]:
    """The arguments' schema, checked and reduced to what is enforced."""
    if not isinstance(schema, Mapping):
        raise ToolDefError("arguments: must be a table (a JSON Schema of type object)")
    unknown = sorted(set(schema) - _TOP_KEYS)
    if unknown:
        raise ToolDefError(f"arguments: unsupported keyword(s) {', '.join(map(repr, unknown))}")
    if schema.get("type", "object") != "object":
        raise ToolDefError("arguments: type must be \"object\"")
    if schema.get("additionalProperties", False) is not False:
        raise ToolDefError("arguments: additionalProperties may only be false")
    props = schema.get("properties") or {}
    if not isinstance(props, Mapping) or len(props) > MAX_PROPERTIES:
        raise ToolDefError(f"arguments.properties: a table of at most {MAX_PROPERTIES} "
                           "properties")
    checked: dict[str, Any] = {}
    for name, prop in props.items():
        if not isinstance(name, str) or not _PROP_NAME.fullmatch(name):
            raise ToolDefError(f"arguments.properties: {_shown(name)} is not a valid name "
                               "(a letter or '_', then letters, digits, '_')")
        checked[name] = _check_property(name, prop)
    required = schema.get("required") or []
    if (not isinstance(required, list) or not all(isinstance(r, str) for r in required)
            or len(set(required)) != len(required)):
        raise ToolDefError("arguments.required: a list of distinct property names")
    for r in required:
        if r not in checked:
            raise ToolDefError(f"arguments.required: {_shown(r)} is not a property")
    out: dict[str, Any] = {"type": "object", "properties": checked, "required": list(required)}
    if isinstance(schema.get("description"), str):
        out["description"] = schema["description"][:MAX_DESCRIPTION]
    return out


def check_template(argv: Sequence[str], schema: Mapping[str, Any]) -> tuple[str, ...]:
    if not argv or len(argv) > MAX_ARGV:
        raise ToolDefError(f"argv: 1..{MAX_ARGV} strings")
    props = schema.get("properties") or {}
    for i, element in enumerate(argv):
        if not isinstance(element, str) or "\0" in element or len(element) > MAX_ELEMENT:
            raise ToolDefError(f"argv[{i}]: a string without NUL, at most {MAX_ELEMENT}")
        names = _PLACEHOLDER.findall(element)
        if i == 0 and (names or not element):
            raise ToolDefError("argv[0]: the program must be fixed text (no placeholder)")
        if len(names) > 1:
            raise ToolDefError(f"argv[{i}]: {_shown(element)} has {len(names)} placeholders; "
                               "at most one per element")
        for name in names:
            if name not in props:
                raise ToolDefError(f"argv[{i}]: {{{name}}} names no property of arguments")
    return tuple(argv)


def make_tool(
    name: str, *, description: str, schema: object, argv: Sequence[str], output: str,
    sends_data: bool, timeout: int, builtin: Registry = TOOLS,
) -> ToolDef:
    """Raises ToolDefError saying what is wrong."""
    check_name(name, builtin)
    if len(description) > MAX_DESCRIPTION:
        raise ToolDefError(f"description: at most {MAX_DESCRIPTION} characters")
    checked = check_schema(schema)
    try:
        label = Sensitivity.parse(output)
    except InvalidArgument as exc:
        raise ToolDefError(f"output: {exc}") from None
    if not 1 <= timeout <= MAX_TIMEOUT:
        raise ToolDefError(f"timeout: 1..{MAX_TIMEOUT} seconds")
    return ToolDef(name, description, checked, check_template(argv, checked), label,
                   bool(sends_data), int(timeout))


# -------------------------------------------------------------------- calls


def _check_value(name: str, prop: Mapping[str, Any], value: object) -> None:
    kind = prop["type"]
    if not _type_ok(kind, value):
        raise InvalidArgument(f"argument {name!r} must be a{'n' if kind == 'integer' else ''} "
                              f"{kind}")
    if isinstance(value, str):
        if "\0" in value:
            raise InvalidArgument(f"argument {name!r} contains a NUL byte")
        limit = min(prop.get("maxLength", MAX_STRING), MAX_STRING)
        if len(value) > limit:
            raise InvalidArgument(f"argument {name!r} is longer than {limit} characters")
        if len(value) < prop.get("minLength", 0):
            raise InvalidArgument(f"argument {name!r} is shorter than {prop['minLength']}")
    if kind in ("integer", "number"):
        assert isinstance(value, int | float)
        if "minimum" in prop and value < prop["minimum"]:
            raise InvalidArgument(f"argument {name!r} is below {prop['minimum']}")
        if "maximum" in prop and value > prop["maximum"]:
            raise InvalidArgument(f"argument {name!r} is above {prop['maximum']}")
    if "enum" in prop and not any(value == e and type(value) is type(e) for e in prop["enum"]):
        raise InvalidArgument(f"argument {name!r}: {_shown(value)} is not one of "
                              f"{', '.join(_shown(e) for e in prop['enum'][:10])}")


def check_args(tool: ToolDef, args: Mapping[str, Any]) -> dict[str, Any]:
    """The call's arguments against the schema, defaults filled in;
    InvalidArgument naming the first that is wrong."""
    props = tool.properties
    if len(args) > MAX_PROPERTIES:
        raise InvalidArgument(f"{tool.name}: too many arguments")
    for key in args:
        if key not in props:
            raise InvalidArgument(f"{tool.name}: unknown argument {_shown(key)}")
    out: dict[str, Any] = {}
    for name, prop in props.items():
        if name in args:
            try:
                _check_value(name, prop, args[name])
            except InvalidArgument as exc:
                raise InvalidArgument(f"{tool.name}: {exc}") from None
            out[name] = args[name]
        elif "default" in prop:
            out[name] = prop["default"]
        elif name in tool.schema.get("required", ()):
            raise InvalidArgument(f"{tool.name}: missing argument {name!r}")
    return out


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render(tool: ToolDef, args: Mapping[str, Any]) -> list[str]:
    """The argv for checked arguments (check_args first)."""
    argv: list[str] = []
    separated = False
    for i, element in enumerate(tool.argv):
        m = _PLACEHOLDER.search(element)
        if m is None or i == 0:
            argv.append(element)
            separated = separated or element == SEPARATOR
            continue
        name = m.group(1)
        if name not in args:
            continue
        value = _text(args[name])
        if m.start() == 0 and not separated and value.startswith("-"):
            raise InvalidArgument(
                f"{tool.name}: argument {name!r} starts with '-', which would make it an "
                f"option here (the template puts it before '--')")
        argv.append(element[: m.start()] + value + element[m.end():])
    return argv


def command_line(argv: Sequence[str], limit: int | None = None) -> str:
    """The argv as a shell would quote it: a call's target, whole (rules
    must see all of it; the argv is bounded by MAX_ARGV and MAX_ELEMENT),
    or cut at `limit` for a person to read."""
    text = shlex.join(argv)
    return text if limit is None or len(text) <= limit else text[:limit] + "…"


def declared(tool: ToolDef, args: Mapping[str, Any], fmt: str) -> list[str]:
    """The checked arguments' values whose property declares `format = fmt`."""
    return [str(args[name]) for name, prop in tool.properties.items()
            if prop.get("format") == fmt and isinstance(args.get(name), str)]


def positional(tool: ToolDef, values: Sequence[str]) -> dict[str, Any]:
    """`lev tool NAME V...`: values to properties in their declared order,
    converted by the property's type."""
    props = list(tool.properties.items())
    if len(values) > len(props):
        raise InvalidArgument(f"{tool.name}: too many arguments (it takes {len(props)})")
    out: dict[str, Any] = {}
    for (name, prop), text in zip(props, values, strict=False):
        out[name] = _from_text(name, prop.get("type", "string"), text)
    return out


def _from_text(name: str, kind: str, text: str) -> object:
    if kind == "string":
        return text
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text)
    except ValueError:
        raise InvalidArgument(f"argument {name!r} must be a{'n' if kind == 'integer' else ''} "
                              f"{kind}") from None
    if text in ("true", "false"):
        return text == "true"
    raise InvalidArgument(f"argument {name!r} must be true or false")
