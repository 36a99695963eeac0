"""The tool registry: every tool the broker serves, with its argument schema,
the permission it has when no config names it, the label of what it returns
and whether it can send data off the machine. The config's `unknown-tool`
finding, the gate, the broker, `lev policy`, `lev mcp` and the bus's
`PolicyAdd` all read this one table; `cli/toolfast.py` keeps an import-free
copy of the positional forms (a unit test holds the two equal).

A `Registry` is a value: a blueprint's own tools make a larger one for its
agents (`with_tools`), never a change to `TOOLS`."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from leviathd.domain.permission import Permission
from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import InvalidArgument


class ToolKind(StrEnum):
    """What a tool touches; the gate's path checks and the broker's dispatch go by it."""

    READ = "read"  # host paths, read (workdir or a granted read path)
    WRITE = "write"  # workdir paths, written
    WEB = "web"  # an http(s) URL on the host network
    SHELL = "shell"  # a command in the agent's own sandbox
    CREDENTIAL = "credential"  # a configured command run with a secret
    GIT = "git"  # a git credential's token, for the sandbox's git credential helper
    SSH = "ssh"  # a login signed by the sandbox's SSH agent (called by the daemon only)
    BLUEPRINT = "blueprint"  # a blueprint's [tools.NAME] argv, in the agent's own sandbox


class SendsOut(StrEnum):
    """Whether a tool can move bytes off the machine (then the taint gate holds
    it to its clearance)."""

    NEVER = "never"
    ALWAYS = "always"
    WITH_NETWORK = "with-network"  # only when the sandbox has a network


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # JSON schema type: "string", "integer", "boolean", "array" (of strings), "object"
    required: bool = True
    description: str = ""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    params: tuple[Param, ...]
    kind: ToolKind
    # The label of what it returns; a READ outside the workdir is Private
    # whatever this says (policy/labels.py).
    label: Sensitivity
    sends_out: SendsOut = SendsOut.NEVER
    # The highest label it may send out when no config lowers it (None: it
    # sends nothing out).
    clearance: Sensitivity | None = None
    # The permission it has when no config names it: permissions only tighten,
    # and the path and taint checks still apply after this one.
    permission: Permission = Permission.ALLOW
    # A blueprint may set it to allow where the user's configs do not name it
    # (the spec's one exception to tighten-only permissions).
    pre_allowable: bool = False
    # Positional form (`lev tool NAME ARGS...`): the params taken in order;
    # the last may be variadic.
    positional: tuple[str, ...] = ()
    variadic: str | None = None
    # A blueprint tool's own JSON Schema (policy/tooldef.py checked it); the
    # built-in tools' is made from `params`.
    schema: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)

    def input_schema(self) -> dict[str, Any]:
        if self.schema is not None:
            return {**self.schema, "additionalProperties": False}
        props: dict[str, Any] = {}
        for p in self.params:
            schema: dict[str, Any] = {"type": p.type}
            if p.type == "array":
                schema["items"] = {"type": "string"}
            if p.type == "object":
                schema["additionalProperties"] = {"type": "string"}
            if p.description:
                schema["description"] = p.description
            props[p.name] = schema
        return {
            "type": "object",
            "properties": props,
            "required": [p.name for p in self.params if p.required],
            "additionalProperties": False,
        }

    def can_send_out(self, *, network: bool) -> bool:
        if self.sends_out is SendsOut.WITH_NETWORK:
            return network
        return self.sends_out is SendsOut.ALWAYS


# Policy may name any tool (an MCP server's, a blueprint's), not only the
# built-in ones; a name is one token, so that it reads the same everywhere.
_TOOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,127}")


class Registry(Mapping[str, Tool]):
    """Tools by name; `aliases` are other names policy may use for one of them."""

    def __init__(self, tools: tuple[Tool, ...], aliases: Mapping[str, str]) -> None:
        by_name: dict[str, Tool] = {}
        for t in tools:
            if t.name in by_name or t.name in aliases:
                raise ValueError(f"tool {t.name!r} registered twice")
            by_name[t.name] = t
        self._tools = by_name
        self._aliases = dict(aliases)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> tuple[str, ...]:
        """The tool names, sorted (how findings and `lev policy` list them)."""
        return tuple(sorted(self._tools))

    def canonical(self, name: str) -> str:
        return self._aliases.get(name, name)

    def find(self, name: str) -> Tool | None:
        """The tool `name` or its alias stands for, None for an unknown one."""
        return self._tools.get(self.canonical(name))

    def kind_of(self, name: str) -> ToolKind | None:
        tool = self._tools.get(name)
        return tool.kind if tool is not None else None

    def named(self, kind: ToolKind) -> frozenset[str]:
        return frozenset(n for n, t in self._tools.items() if t.kind is kind)

    def with_tools(self, *extra: Tool) -> Registry:
        """This registry and `extra` (a blueprint's tools); a clash is an error."""
        return Registry((*self._tools.values(), *extra), self._aliases)


def checked_tool_name(name: str, tools: Registry | None = None) -> str:
    """`name` as policy stores it (aliases resolved), or InvalidArgument."""
    if not _TOOL_NAME.fullmatch(name):
        raise InvalidArgument(
            f"tool name {name[:64]!r} is not valid: a letter, then letters, digits, "
            "'_', '.', ':' or '-' (at most 128)"
        )
    return (tools or TOOLS).canonical(name)


def _p(name: str, type_: str = "string", required: bool = True, desc: str = "") -> Param:
    return Param(name, type_, required, desc)


_INTERNAL = Sensitivity.INTERNAL
_PUBLIC = Sensitivity.PUBLIC

# Internal clearance by default for everything that sends: an agent may send
# what it read in its own workdir (it was given that work), but not what came
# through a read-path grant or a credential.
TOOLS = Registry(
    (
        Tool(
            "read_file",
            "Read a text file (workdir, or a granted read path).",
            (_p("path"), _p("max_bytes", "integer", False)),
            ToolKind.READ, _INTERNAL,
            positional=("path",),
        ),
        Tool(
            "read_files",
            "Read several text files.",
            (_p("paths", "array"), _p("max_bytes", "integer", False)),
            ToolKind.READ, _INTERNAL,
            variadic="paths",
        ),
        Tool(
            "list_dir",
            "List a directory's entries.",
            (_p("path", required=False),),
            ToolKind.READ, _INTERNAL,
            positional=("path",),
        ),
        Tool(
            "write_file",
            "Write a file in the workdir (content from the argument, or stdin with lev tool).",
            (_p("path"), _p("content")),
            # An acknowledgement, no data.
            ToolKind.WRITE, _PUBLIC,
            positional=("path", "content"),
        ),
        Tool(
            "edit_file",
            "Replace text in a workdir file: old must occur exactly once unless all is true.",
            (_p("path"), _p("old"), _p("new"), _p("all", "boolean", False)),
            ToolKind.WRITE, _PUBLIC,
            positional=("path", "old", "new"),
        ),
        Tool(
            "shell",
            "Run a shell command in the agent's own sandbox.",
            (_p("command"), _p("timeout", "integer", False)),
            # The shell sees the workdir (and whatever the sandbox mounts).
            ToolKind.SHELL, _INTERNAL, SendsOut.WITH_NETWORK, _INTERNAL,
            variadic="command",
        ),
        Tool(
            "web_fetch", "Fetch a web page (GET).", (_p("url"),),
            ToolKind.WEB, _PUBLIC, SendsOut.ALWAYS, _INTERNAL,
            pre_allowable=True,
            positional=("url",),
        ),
        Tool(
            "http_get",
            "HTTP GET.",
            (_p("url"), _p("headers", "object", False)),
            ToolKind.WEB, _PUBLIC, SendsOut.ALWAYS, _INTERNAL,
            positional=("url",),
        ),
        Tool(
            "http_post",
            "HTTP POST a body.",
            (_p("url"), _p("body"), _p("headers", "object", False)),
            ToolKind.WEB, _PUBLIC, SendsOut.ALWAYS, _INTERNAL,
            positional=("url", "body"),
        ),
        Tool(
            "credential",
            "Run a configured command with a secret the agent never sees.",
            (_p("name"), _p("args", "array", False)),
            ToolKind.CREDENTIAL, Sensitivity.PRIVATE, SendsOut.ALWAYS, _INTERNAL,
            positional=("name",),
            variadic="args",
        ),
        # Issue 15 §3 (broker/gitcreds.py): a token handed to git is the
        # agent's from then on, hence Internal; a push sends the workdir's
        # commits out, and the push token is the means to publish: it asks.
        Tool(
            "git_fetch",
            "The token of a git credential covering the URL, for a fetch (the git "
            "credential helper calls this).",
            (_p("url"),),
            ToolKind.GIT, _INTERNAL,
            positional=("url",),
        ),
        Tool(
            "git_push",
            "The token of a git credential covering the URL, for a push.",
            (_p("url"),),
            ToolKind.GIT, _INTERNAL, SendsOut.ALWAYS, _INTERNAL,
            permission=Permission.ASK,
            positional=("url",),
        ),
        # The SSH agent (creds/sshagent.py) puts each covered login to the gate.
        Tool(
            "ssh_sign",
            "A login signed by the sandbox's SSH agent (its socket calls this, not an agent).",
            (_p("host"),),
            ToolKind.SSH, _PUBLIC,
            positional=("host",),
        ),
    ),
    # The seeds call the shell tool "bash".
    aliases={"bash": "shell"},
)
