"""`lev ps`, `lev stop ID`, `lev logs ID [-f]`: thin clients of the daemon."""

from __future__ import annotations

import os
import sys
import time

from leviathd.cli.text import OutputFilter, field
from leviathd.cli.wire import SyncClient, Variant

# typing imports re; mypy reads any TYPE_CHECKING as true (issue 18: start-up).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import Any

COLUMNS = ("ID", "USER", "AGENT", "STATE", "SANDBOX", "READS", "MEM", "TASKS", "AGE", "UNIT")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ps = sub.add_parser("ps", help="list your agents (everyone's with manage-any)")
    ps.add_argument("--all", "-a", action="store_true", help="include agents that ended")
    ps.add_argument("--json", action="store_true", help="machine-readable output")
    ps.set_defaults(func=ps_main)
    stats = sub.add_parser("stats", help="the daemon's figures (needs manage-any)",
                           description="The figures of the metrics file, now: OpenMetrics "
                           "text, or one JSON object per sample with --json.")
    stats.add_argument("--json", action="store_true", help="machine-readable output")
    stats.set_defaults(func=stats_main)
    stop = sub.add_parser("stop", help="stop an agent")
    stop.add_argument("id", metavar="ID", help="the agent's id (eight hex digits, from lev ps)")
    stop.set_defaults(func=stop_main)
    logs = sub.add_parser("logs", help="show an agent's output (from the journal)")
    logs.add_argument("id", metavar="ID", help="the agent's id (eight hex digits, from lev ps)")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    logs.add_argument(
        "--raw", action="store_true",
        help="pass the output through as the agent wrote it, control characters and all",
    )
    logs.set_defaults(func=logs_main)


def plain(info: dict[str, Variant]) -> dict[str, Any]:
    return {k: v.value for k, v in info.items()}


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if value < 1024 or unit == "T":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return str(n)


def used_of(used: str, limit: int | None, show: Callable[[int], str]) -> str:
    """"12.0M/6.0G": use and the scope's limit, as systemd applies it (the
    config's, or the machine's default), for a running agent."""
    return used if limit is None else f"{used}/{show(limit)}"


def human_age(seconds: float) -> str:
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def table_row(a: dict[str, Any], now: float) -> list[str]:
    sandbox = a["sandbox"] + ("".join(f" ({m})" for m in a.get("marks", []) if m != "unsandboxed"))
    if "unsandboxed" in a.get("marks", []):
        sandbox += " UNSANDBOXED"
    state = a["state"]
    if "exit_status" in a and state != "running":
        state = f"{state}({a['exit_status']})"
    return [
        a["id"], a["user"], a["agent"], state, sandbox,
        f"{a['reads_granted']}/{a['reads_declared']}",
        used_of(human_bytes(a.get("memory")), a.get("memory_max"), human_bytes),
        used_of(str(a["tasks"]) if "tasks" in a else "-", a.get("tasks_max"), str),
        human_age(now - a["started_at"]), a["unit"],
    ]


def format_table(rows: list[list[str]]) -> str:
    rows = [[field(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


# A page of a few hundred rows per reply: the daemon bounds each reply, and
# `lev ps --all` asks page after page until the last.
MAX_PAGES = 10_000


def ps_main(args: argparse.Namespace) -> int:
    client = SyncClient()
    agents: list[Any] = []
    try:
        cursor = ""
        for _ in range(MAX_PAGES):
            options = {"all": Variant("b", bool(args.all)), "cursor": Variant("s", cursor)}
            rows, cursor = client.call("ListPage", "a{sv}", [options])
            agents += rows
            if not cursor:
                break
    finally:
        client.close()
    # Pages come running agents first, then ended ones newest first; shown
    # as ever, by start, the newest last.
    items = sorted((plain(a) for a in agents), key=lambda a: float(a.get("started_at", 0)))
    try:
        if args.json:
            import json

            print(json.dumps(items, indent=2))
            sys.stdout.flush()
            return 0
        now = time.time()
        print(format_table([list(COLUMNS)] + [table_row(a, now) for a in items]))
        sys.stdout.flush()
    except BrokenPipeError:
        # `lev ps | head`: the reader has all it wanted. Point stdout at
        # /dev/null so that the interpreter's final flush does not complain.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0


def stats_main(args: argparse.Namespace) -> int:
    client = SyncClient()
    try:
        text, as_json = client.call("Stats", "", [])
    finally:
        client.close()
    if not args.json:
        sys.stdout.write(str(text))
        return 0
    import json

    print(json.dumps(json.loads(str(as_json)), indent=2))
    return 0


def stop_main(args: argparse.Namespace) -> int:
    client = SyncClient()
    try:
        client.call("Stop", "s", [args.id])
    finally:
        client.close()
    return 0


def _logs(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    # The agent wrote these bytes: on a terminal, escape sequences in them
    # would act on the reader's screen, so they are shown escaped unless
    # asked for (like journalctl --all).
    screen = None if args.raw else OutputFilter()
    client = SyncClient()
    try:
        (index,), fds = client.call_with_fds("Logs", "sb", [args.id, args.follow])
        fd = fds[index]
        for other in fds:
            if other != fd:
                os.close(other)
        # The connection stays open while we read: the daemon ends the
        # reader behind the pipe when it goes.
        try:
            while chunk := os.read(fd, 65536):
                out.write(chunk if screen is None else screen.feed(chunk))
                out.flush()
        finally:
            os.close(fd)
    finally:
        client.close()
    if screen is not None:
        out.write(screen.feed(b"", final=True))
        out.flush()
    return 0


def logs_main(args: argparse.Namespace) -> int:
    try:
        return _logs(args)
    except BrokenPipeError:
        return 0
