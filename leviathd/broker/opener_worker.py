"""The opener process (see opener.py). Runs as a script under `python -I -S`
with the agent's uid, gid and groups; stdlib only, imports nothing of ours."""

from __future__ import annotations

import json
import os
import socket
import sys


def serve(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 65536, 1)
        except OSError:
            return
        if not data:
            return
        try:
            req = json.loads(data)
            dir_fd = fds[0] if fds else None
            # O_CLOEXEC always: the descriptor is for the broker only.
            opened = os.open(
                str(req["path"]), int(req["flags"]) | os.O_CLOEXEC, int(req["mode"]), dir_fd=dir_fd
            )
        except OSError as exc:
            sock.send(json.dumps({"ok": False, "errno": exc.errno or 5}).encode())
        except (ValueError, KeyError, TypeError):
            sock.send(json.dumps({"ok": False, "errno": 22}).encode())
        else:
            socket.send_fds(sock, [b'{"ok": true}'], [opened])
            os.close(opened)
        finally:
            for extra in fds:
                os.close(extra)


def _not_dumpable() -> None:
    # Other processes of the same user on the host may not ptrace this one
    # (or read its memory): it talks to root and holds descriptors for it.
    import ctypes

    pr_set_dumpable = 4
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_dumpable, 0, 0, 0, 0)


if __name__ == "__main__":
    _not_dumpable()
    serve(int(sys.argv[1]))
