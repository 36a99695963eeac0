"""What the daemon loads before it serves: libraries only some configurations
need are loaded when first used, so every daemon does not pay for them
(asyncssh: ~12 MB and ~0.3 s on these machines, for ssh credentials only)."""

from __future__ import annotations

import subprocess
import sys

LAZY = ("asyncssh", "cryptography")


def test_the_daemon_does_not_load_what_only_ssh_credentials_need() -> None:
    code = ("import sys, leviathd.daemon; "
            f"print(' '.join(m for m in {LAZY!r} if m in sys.modules))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert got == [], f"loaded at start: {got}"
