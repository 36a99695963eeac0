"""The daemon's figures for the fleet's monitoring (issue 46): counters the
code moves where things happen (starts, refusals, proxy connections, tool
calls...), gauges read when the figures are shown, and the OpenMetrics text
of them all (https://prometheus.io/docs/specs/om/open_metrics_spec/), which
metricsfile.py writes for node exporter's textfile collector and `Stats`
returns on the bus.

Bounded whatever users do: a family holds at most MAX_LABEL_SETS label sets
(users, credential names and the like are the users' to multiply); past
that, new ones are added up under the value OTHER, so the totals stay right
and the text stays small. Label values are cut to MAX_LABEL_VALUE characters
and escaped."""

from __future__ import annotations

import dataclasses
import os
import resource
from collections.abc import Iterable, Sequence

PREFIX = "leviathd_"
MAX_LABEL_SETS = 200
MAX_LABEL_VALUE = 64
OTHER = "(other)"
# The kinds of refusal counted (`refused(layer)`), in one place: the
# docs list them (docs/operations.md, "Metrics").
LAYERS = ("polkit", "admission", "busy", "policy", "proxy", "engine")


@dataclasses.dataclass
class Family:
    name: str
    kind: str  # "counter" or "gauge"
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""
    values: dict[tuple[str, ...], float] = dataclasses.field(default_factory=dict)

    def key(self, values: Sequence[str]) -> tuple[str, ...]:
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}")
        key = tuple(str(v)[:MAX_LABEL_VALUE] for v in values)
        if key in self.values or len(self.values) < MAX_LABEL_SETS - 1:
            return key
        # One place is kept for the sum of all the others.
        return tuple(OTHER for _ in self.labels)

    def inc(self, *values: str, by: float = 1) -> None:
        key = self.key(values)
        self.values[key] = self.values.get(key, 0) + by


class Registry:
    def __init__(self) -> None:
        self.families: dict[str, Family] = {}

    def family(self, name: str, kind: str, help: str, labels: tuple[str, ...] = (),
               unit: str = "") -> Family:
        if name not in self.families:
            fam = self.families[name] = Family(name, kind, help, labels, unit)
            if not labels:
                fam.values[()] = 0  # shown from the start, as 0
        return self.families[name]

    def snapshot(self) -> list[Family]:
        """A copy to render elsewhere (a thread): the loop goes on moving the
        counters meanwhile."""
        return [dataclasses.replace(f, values=dict(f.values)) for f in self.families.values()]


REGISTRY = Registry()
STARTS = REGISTRY.family("starts", "counter", "Agent starts accepted.")
START_FAILURES = REGISTRY.family(
    "start_failures", "counter", "Agent starts that failed or were refused, by error.",
    ("error",))
REFUSALS = REGISTRY.family("refusals", "counter", "Requests refused, by the layer that refused.",
                           ("layer",))
PROXY_CONNECTIONS = REGISTRY.family(
    "proxy_connections", "counter", "Agents' connections through the proxy, by outcome.",
    ("outcome",))
PROXY_BYTES = REGISTRY.family("proxy", "counter",
                              "Bytes through the proxy, by direction (sent by agents or received).",
                              ("direction",), unit="bytes")
INJECTED = REGISTRY.family("injected_requests", "counter",
                           "Requests the proxy put a credential in, by credential name.",
                           ("credential",))
BROKER_CALLS = REGISTRY.family("broker_calls", "counter",
                               "Gated tool calls decided by the broker, by outcome.", ("outcome",))
APPROVALS_WAITING = REGISTRY.family("approvals_waiting", "gauge",
                                    "Tool calls held for a person's answer.")
for _layer in LAYERS:  # every layer shown from the start, as 0
    REFUSALS.values[(_layer,)] = 0


def refused(layer: str) -> None:
    REFUSALS.inc(layer)


# The proxy's tool name in the audit trail (proxy/server.py TOOL): its
# connections are counted by the proxy itself.
PROXY_TOOL = "network"


def tool_decision(tool: str, outcome: str) -> None:
    """One gated tool call's decision (audit/trail.py sees each one)."""
    if tool == PROXY_TOOL:
        return
    BROKER_CALLS.inc(outcome)
    if outcome == "deny":
        refused("policy")


def approvals_waiting(change: int) -> None:
    APPROVALS_WAITING.values[()] = max(0, APPROVALS_WAITING.values.get((), 0) + change)


def running_family(rows: Iterable[tuple[str, str]]) -> Family:
    """Running agents per (user, sandbox kind), from the records' pairs."""
    fam = Family("agents_running", "gauge", "Running agents, by user and sandbox kind.",
                 ("user", "kind"))
    for user, kind in rows:
        fam.inc(user, kind)
    return fam


def process_families() -> list[Family]:
    """The daemon's own descriptors and resident memory (a few syscalls:
    called off the event loop)."""
    fds = Family("open_fds", "gauge", "The daemon's open file descriptors.")
    try:
        fds.values[()] = len(os.listdir("/proc/self/fd"))
    except OSError:
        pass
    rss = Family("resident_memory", "gauge", "The daemon's resident memory.", unit="bytes")
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            rss.values[()] = int(f.read(256).split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        pass
    limit = Family("max_fds", "gauge", "The daemon's descriptor limit (RLIMIT_NOFILE).")
    limit.values[()] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return [fds, limit, rss]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def rows(families: Iterable[Family]) -> list[dict[str, object]]:
    """The same samples as `render`, one object each ({"name", "labels",
    "value"}), for `lev stats --json`: no reader of the text needed."""
    out: list[dict[str, object]] = []
    for fam in families:
        name = PREFIX + fam.name + (f"_{fam.unit}" if fam.unit else "")
        sample = name + ("_total" if fam.kind == "counter" else "")
        for key in sorted(fam.values):
            out.append({"name": sample, "labels": dict(zip(fam.labels, key, strict=True)),
                        "value": fam.values[key]})
    return out


def render(families: Iterable[Family]) -> str:
    """The OpenMetrics text of `families`, ending with `# EOF`."""
    out: list[str] = []
    for fam in families:
        name = PREFIX + fam.name + (f"_{fam.unit}" if fam.unit else "")
        out.append(f"# TYPE {name} {fam.kind}")
        if fam.unit:
            out.append(f"# UNIT {name} {fam.unit}")
        out.append(f"# HELP {name} {fam.help}")
        sample = name + ("_total" if fam.kind == "counter" else "")
        for key in sorted(fam.values):
            labels = ",".join(f'{label}="{_escape(value)}"'
                              for label, value in zip(fam.labels, key, strict=True))
            out.append(f"{sample}{'{' + labels + '}' if labels else ''} "
                       f"{_number(fam.values[key])}")
    out.append("# EOF")
    return "\n".join(out) + "\n"
