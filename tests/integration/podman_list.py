"""podman in the test bed, its listings asked again while objects go.

A listing (`podman ps`, `podman volume ls`, `podman network ls`) lists the
objects, then reads each: one removed in between (the daemon removing an
ended agent's things, a container's --rm) fails the whole listing with
"no such ..." in podman 4.3 (a CI run: `podman volume ls` exited 125 with
"no volume with name vol-a found in database" while the test waited for an
ended agent's volume to go). Such a listing is asked again, a few times;
any other failure fails the test at once."""

from __future__ import annotations

import time

from testbed import Testbed

TRIES = 20


def podman(bed: Testbed, *args: str) -> str:
    """podman's standard output for `args`, run as root in the bed."""
    listing = args[0] == "ps" or "ls" in args[:2]
    for _ in range(TRIES):
        r = bed.run(["podman", *args], check=False)
        if r.returncode == 0:
            return r.stdout
        if not listing or "no such" not in r.stderr:
            break
        time.sleep(0.2)
    raise AssertionError(f"podman {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
