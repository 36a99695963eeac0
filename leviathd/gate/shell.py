"""The `shell` tool's process: `python -m leviathd.gate.shell`, started by the
daemon for one command of one agent.

It reads the sandbox spec (JSON) from stdin and waits for end of file: the
daemon first moves this process into the agent's scope (its cgroups) and
only then sends the spec, so nothing runs outside
the scope. It then checks that it really sits in the scope named in the spec
message, puts /dev/null on stdin and runs the command in the agent's own
running fence (`join`: its anchor process, sandbox/join.py), the same
files at the same paths as the agent's processes, exiting with the
command's status. stdout and stderr are the daemon's pipes.
With `hold` in the message (a socket the daemon passed), the fence's PID 1
says so on it once its mounts are built and runs nothing of the command
until the daemon answers: the daemon marks those mounts for its write watch
first (broker/writewatch.py), so no write of the command goes unseen.
A credential command (issue 21) comes the same way, with a spec of its own
(creds/fence.py) and its secret as `stdin`.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from leviathd.sandbox import fencehold
from leviathd.sandbox.launchers import RunContext, launcher
from leviathd.sandbox.spec import SandboxSpec

_RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def _in_unit(unit: str) -> bool:
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        return any(unit in line.rstrip("\n").split("/") for line in f)


# What a credential command may be given on its standard input (its secret):
# one pipe's worth, written before the command starts, so nothing waits on it.
MAX_STDIN = 60 * 1024


def _stdin(text: object) -> None:
    """/dev/null on stdin, or a pipe holding `text` (a credential's secret and
    a newline), closed behind it."""
    data = text.encode() if isinstance(text, str) else b""
    if not data:
        fd = os.open(os.devnull, os.O_RDONLY)
    elif len(data) > MAX_STDIN:
        raise SystemExit(f"leviathd shell: stdin larger than {MAX_STDIN} bytes")
    else:
        fd, w = os.pipe()
        os.write(w, data)
        os.close(w)
    os.dup2(fd, 0)
    os.close(fd)


def main() -> int:
    payload = sys.stdin.buffer.read()
    if not payload:
        return 125  # the daemon gave up before sending the spec
    message = json.loads(payload)
    unit = str(message["unit"])
    if not _in_unit(unit):
        print(f"leviathd shell: not inside {unit}; refusing to run", file=sys.stderr)
        return 125
    spec = SandboxSpec.from_dict(message["spec"])
    hold = message.get("hold")
    ready = None
    if isinstance(hold, int) and hold > 2:
        os.set_inheritable(hold, False)
        ready = fencehold.waiter(hold)
    _stdin(message.get("stdin"))
    for sig in _RESET_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    sys.stdout.flush()
    entry = launcher(spec.kind)
    anchor = message.get("join")
    if entry.join is not None and isinstance(anchor, int) and anchor > 1:
        # The agent's own running fence: its home, /tmp and layers (issue 33).
        from leviathd.errors import Unavailable

        try:
            return entry.join(spec, anchor, unit, ready)
        except Unavailable as exc:
            print(f"leviathd shell: {exc}", file=sys.stderr)
            return 125
    if not entry.tools:
        print(f"leviathd shell: sandbox kind {str(spec.kind)!r} is not supported",
              file=sys.stderr)
        return 125
    return entry.run(spec, RunContext(ready=ready))

if __name__ == "__main__":
    sys.exit(main())
