"""The daemon's open files or resident memory read only at a quiescent point
(issue 50): read every 0.2 s inside the bed until `settled` reads in a row
agree (nothing accepted, refused, closed or allocated meanwhile: a flood's
backlog drained, a background refresh done), within `wait` seconds. Under
load the daemon takes longer to get there, and is never counted on the way:
a test that compares counts compares quiet ones, whatever the machine's
load."""

from __future__ import annotations

from testbed import Testbed

_READ = {
    # Not counted: the scratch pool's ready images and its template (issue
    # 47: unnamed files in the scratch folder held on purpose, which a start
    # may fill at any time), at most CAPACITY + 1 = 3 of them: a fourth
    # such file is counted, so a leaked scratch image still shows.
    "fds": ("ls -l /proc/$pid/fd | awk '/ -> /{n++; if (/\\/#[0-9]+ \\(deleted\\)$/ && p < 3) p++}"
            " END {print n - p}'"),
    "rss_kib": "sed -n 's/^VmRSS:[^0-9]*\\([0-9]*\\).*/\\1/p' /proc/$pid/status",
}

_SETTLE = r"""
pid=$1; want=$2; wait=$3; last=-1; same=0; end=$(( $(date +%s) + wait ))
while [ "$(date +%s)" -le "$end" ]; do
  c=$(READ)
  if [ "$c" = "$last" ]; then same=$((same+1)); else same=1; last=$c; fi
  if [ "$same" -ge "$want" ]; then echo "$c"; exit 0; fi
  sleep 0.2
done
echo "never settled within ${wait}s (last $last)" >&2; exit 1
"""


FDS = _READ["fds"]


def daemon_pid(bed: Testbed) -> int:
    return int(bed.run(["systemctl", "show", "-P", "MainPID", "leviathd"]).stdout)


def settled(bed: Testbed, pid: int, what: str = "fds", *, reads: int = 8,
            wait: int = 120) -> int:
    """`what` ("fds": open files; "rss_kib": VmRSS) of process `pid` at the
    next quiescent point; fails the test if there is none within `wait` s."""
    script = _SETTLE.replace("READ", _READ[what])
    r = bed.run(["sh", "-c", script, "settle", str(pid), str(reads), str(wait)],
                check=False, timeout=wait + 30)
    assert r.returncode == 0, f"the daemon's {what} never settled: {r.stderr}"
    return int(r.stdout.split()[0])
