"""`lev audit [ID] [--follow] [--json]`: an agent's audit trail, one line per
decision. The daemon reads the journal for us, matching only fields that
journald itself stamps (see leviathd/audit/trail.py), so an entry another user sent
with `LEVIATH_AGENT=<id>` never shows here."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from leviathd.cli.client import Client
from leviathd.cli.text import field
from leviathd.errors import NotFound

MAX_LINE = 1 << 20


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("audit", help="an agent's tool decisions (from the journal, unforgeable)")
    p.add_argument("id", nargs="?", help="the agent (default: your most recently started one)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    p.add_argument("--json", action="store_true", help="one JSON object a line")
    p.set_defaults(func=main)


def _text(value: Any) -> str:
    """A journal field from journalctl's JSON: a string, bytes as a list of
    numbers, or a list of either for a field given more than once."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if all(isinstance(v, int) for v in value):
            return bytes(v & 0xFF for v in value).decode("utf-8", "backslashreplace")
        return ",".join(_text(v) for v in value)
    return str(value)


def record(entry: dict[str, Any]) -> dict[str, Any]:
    """journalctl's entry as lev audit's record."""
    f = {k: _text(v) for k, v in entry.items()}
    try:
        at = int(f.get("__REALTIME_TIMESTAMP", "0")) / 1e6
    except ValueError:
        at = 0.0
    out: dict[str, Any] = {
        "time": datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat(),
        "event": f.get("LEVIATH_EVENT", ""),
        "agent": f.get("LEVIATH_AGENT", ""),
    }
    if out["event"] == "tool":
        out.update(
            tool=f.get("LEVIATH_TOOL", ""), target=f.get("LEVIATH_TARGET", ""),
            decision=f.get("LEVIATH_OUTCOME", ""), rule=f.get("LEVIATH_RULE", ""),
            detail=f.get("LEVIATH_DETAIL", ""), taint_before=f.get("LEVIATH_TAINT", ""),
            taint_after=f.get("LEVIATH_TAINT_AFTER", ""),
            clearance=f.get("LEVIATH_CLEARANCE", ""),
        )
    elif out["event"] == "tool-summary":
        out.update(count=int(f.get("LEVIATH_COUNT", "0") or 0),
                   summary=f.get("LEVIATH_SUMMARY", ""))
    out["message"] = f.get("MESSAGE", "")
    return out


def line(rec: dict[str, Any]) -> str:
    """One line for a person; every value escaped (an agent chose most)."""
    try:
        when = datetime.datetime.fromisoformat(rec["time"]).astimezone()
        stamp = when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    except ValueError:
        stamp = rec["time"]
    if rec["event"] == "tool":
        reason = rec["rule"] + (f": {rec['detail']}" if rec["detail"] else "")
        after = rec["taint_after"] or "-"
        taint = rec["taint_before"] if after in ("-", rec["taint_before"]) else (
            f"{rec['taint_before']}->{after}")
        cells = [rec["tool"], rec["target"] or "-", rec["decision"], reason, f"taint {taint}"]
        return stamp + "  " + "  ".join(field(c) for c in cells)
    label = "summary" if rec["event"] == "tool-summary" else rec["event"] or "-"
    return f"{stamp}  [{field(label)}]  {field(rec['message'])}"


class Lines:
    """journalctl's JSON lines, from chunks of a pipe; a line over MAX_LINE
    is dropped (none of leviathd's records is that large)."""

    def __init__(self, emit: Callable[[dict[str, Any]], None]) -> None:
        self._emit = emit
        self._buf = bytearray()
        self._skipping = False

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        while (end := self._buf.find(b"\n")) >= 0:
            raw = bytes(self._buf[:end])
            del self._buf[: end + 1]
            if self._skipping:
                self._skipping = False
                continue
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if isinstance(entry, dict):
                self._emit(entry)
        if len(self._buf) > MAX_LINE:
            self._buf.clear()
            self._skipping = True


async def _audit(args: argparse.Namespace) -> int:
    def emit(entry: dict[str, Any]) -> None:
        rec = record(entry)
        print(json.dumps(rec) if args.json else line(rec), flush=True)

    client = await Client.connect()
    try:
        agent_id = args.id
        if agent_id is None:
            (agents,) = await client.call("List", "b", [True])
            mine = sorted((a for a in agents if a["uid"].value == os.getuid()),
                          key=lambda a: a["started_at"].value)
            if not mine:
                raise NotFound("you have no agents (give an id)")
            agent_id = str(mine[-1]["id"].value)
            print(f"lev: agent {field(agent_id)}", file=sys.stderr)
        (index,), fds = await client.call_with_fds("Audit", "sb", [agent_id, args.follow])
        await client.drain(fds[index], Lines(emit).feed)
    finally:
        client.close()
    return 0


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_audit(args))
    except BrokenPipeError:
        return 0
