"""The daemon's large buffers go back to the system when freed (leviathd/heap.py)."""

from __future__ import annotations

import subprocess
import sys

# Four threads each make and drop twenty 1 MiB buffers, as broker threads do
# with an agent's file contents; the child prints its RSS growth in KiB.
CHILD = """
import os, sys, threading
from leviathd import heap
if sys.argv[1] == "fixed":
    assert heap.return_large_buffers()
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
def work():
    for _ in range(20):
        buf = os.urandom(1 << 20)
        del buf
before = rss()
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(rss() - before)
"""


def _growth_kib(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], check=True,
                         capture_output=True, text=True).stdout
    return int(out)


def test_freed_megabyte_buffers_of_many_threads_leave_no_resident_memory() -> None:
    # Without the fixed threshold glibc keeps about a MiB per thread here
    # (4 threads: ~4 MiB); with it, what is freed is unmapped.
    assert _growth_kib("fixed") < 1024, _growth_kib("plain")
