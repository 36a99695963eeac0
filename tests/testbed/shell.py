"""`scripts/testbed-shell`: boot the test bed for a person, with the project
installed, the standard users added and leviathd running, then give them a
shell inside (or run one command), and clean everything up on the way out."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from .boot import STANDARD_USERS, Testbed, TestbedError, TestbedUnavailable, check_host

REPO = Path(__file__).resolve().parents[2]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="testbed-shell",
        description="Boot the leviathd test bed (a real systemd, system bus and polkit in "
        "throwaway namespaces), install this checkout and the test users "
        f"({', '.join(STANDARD_USERS)}), start leviathd.service, and open a shell inside. "
        "Everything is removed when the shell (or COMMAND) exits.",
    )
    p.add_argument("--user", "-u", help="shell or command as this user (default root)")
    p.add_argument("--no-daemon", action="store_true", help="do not start leviathd.service")
    p.add_argument("--keep-logs", action="store_true", help="keep boot logs in /var/tmp")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...] to run")
    return p


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _say(msg: str) -> None:
    print(f"testbed-shell: {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command: list[str] = args.command
    if command and command[0] == "--":
        command = command[1:]
    try:
        check_host()
    except TestbedUnavailable as e:
        _say(f"cannot boot the test bed: {e}")
        return 2
    # A hang-up or kill of this script must still power the bed off.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    bed = Testbed(keep_logs=args.keep_logs)
    try:
        t0 = time.monotonic()
        bed.start()
        bed.wait_running()
        _say(f"booted in {bed.boot_seconds:.2f}s (systemd is pid {bed.pid} on the host)")
        bed.install_project(REPO)
        users = bed.add_standard_users()
        # A project folder each: an agent's workdir is a project, not a whole home.
        for name in users:
            bed.run(["mkdir", "-p", "project"], user=name)
        unit = bed.run(["systemctl", "cat", "leviathd.service"], check=False)
        if args.no_daemon:
            pass
        elif unit.returncode != 0:
            _say("units/leviathd.service is not in this checkout: leviathd not started")
        else:
            try:
                bed.start_service("leviathd.service")
                _say("leviathd.service is running")
            except TestbedError as e:
                _say(f"leviathd.service failed to start (continuing):\n{e}")
        _say(
            f"ready in {time.monotonic() - t0:.2f}s; users: "
            + ", ".join(f"{n} ({' '.join(g) or 'no group'})" for n, g in STANDARD_USERS.items())
        )
        env = {"TERM": os.environ.get("TERM", "dumb")}
        argv_inside = command or ["bash", "--login"]
        if not command:
            _say(
                "shell inside the bed; `exit` powers it off. "
                "Try: systemctl status leviathd; "
                "cd /home/alice/project && runuser -u alice -- lev run -- id"
            )
        cwd = f"{users[args.user].home}/project" if args.user in users else None
        proc = subprocess.Popen(bed.command(argv_inside, user=args.user, env=env, cwd=cwd))
        # Ctrl-C belongs to the shell inside: wait it out here (a Python-level
        # handler, unlike SIG_IGN, is not inherited by the child).
        signal.signal(signal.SIGINT, lambda s, f: None)
        try:
            return proc.wait()
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except TestbedError as e:
        _say(str(e))
        return 1
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    finally:
        _say("powering off the test bed")
        with contextlib.suppress(KeyboardInterrupt):
            bed.stop()


if __name__ == "__main__":
    sys.exit(main())
