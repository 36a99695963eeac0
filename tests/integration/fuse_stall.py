"""A hostile user's FUSE file system (stdlib only, mounted with the
setuid fusermount3 that lets any user mount one): one file, `f`, whose
every operation is answered, except a FLUSH from a process of the program
named in argv[2] (its pid, a thread group): that one is never answered, so
the close() that sent it waits for ever in the kernel (a FLUSH is sent on
every close of a FUSE file, and waited for uninterruptibly).

    python3 fuse_stall.py MOUNTPOINT TGID

Prints "ready" once mounted, then "held PID" for each FLUSH held. Ends,
unmounting, on SIGTERM or when the kernel aborts the connection."""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
import subprocess
import sys

IN_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, pad
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
LOOKUP, FORGET, GETATTR, OPEN, READ, RELEASE, FLUSH, INIT = 1, 2, 3, 14, 15, 18, 25, 26
BATCH_FORGET, INTERRUPT = 42, 36
CONTENT = b"hello\n"


def attr(node: int) -> bytes:
    uid, gid = os.getuid(), os.getgid()
    if node == 1:
        return ATTR.pack(1, 0, 0, 0, 0, 0, 0, 0, 0, 0o40755, 2, uid, gid, 0, 4096, 0)
    return ATTR.pack(2, len(CONTENT), 1, 0, 0, 0, 0, 0, 0, 0o100644, 1, uid, gid, 0, 4096, 0)


def tgid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def mount(where: str) -> int:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = dict(os.environ, _FUSE_COMMFD=str(theirs.fileno()))
    subprocess.run(["fusermount3", "-o", "fsname=stall,subtype=stall", "--", where],
                   env=env, pass_fds=[theirs.fileno()], check=True)
    theirs.close()
    _msg, ancillary, _flags, _addr = ours.recvmsg(1, socket.CMSG_SPACE(4))
    ours.close()
    return struct.unpack("i", ancillary[0][2][:4])[0]


def main() -> None:
    where, victim = sys.argv[1], int(sys.argv[2])
    dev = mount(where)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)

    def reply(unique: int, payload: bytes = b"", error: int = 0) -> None:
        os.write(dev, OUT_HEADER.pack(OUT_HEADER.size + len(payload), -error, unique) + payload)

    try:
        while True:
            try:
                data = os.read(dev, 1 << 18)
            except OSError as exc:
                if exc.errno in (errno.ENODEV, errno.ECONNABORTED):
                    return  # unmounted, or aborted
                if exc.errno in (errno.EINTR, errno.ENOENT):
                    continue
                raise
            _len, op, unique, node, _uid, _gid, pid, _pad = IN_HEADER.unpack_from(data)
            body = data[IN_HEADER.size:]
            if op in (FORGET, BATCH_FORGET, INTERRUPT):
                continue
            if op == INIT:
                reply(unique, struct.pack("<IIIIHHI", 7, 19, 65536, 0, 16, 12, 65536))
            elif op == GETATTR:
                reply(unique, struct.pack("<QII", 0, 0, 0) + attr(node))
            elif op == LOOKUP:
                if body.split(b"\0", 1)[0] == b"f":
                    reply(unique, struct.pack("<QQQQII", 2, 0, 0, 0, 0, 0) + attr(2))
                else:
                    reply(unique, error=errno.ENOENT)
            elif op == OPEN:
                reply(unique, struct.pack("<QII", 1, 0, 0))
            elif op == READ:
                offset, size = struct.unpack_from("<QI", body, 8)
                reply(unique, CONTENT[offset:offset + size])
            elif op == FLUSH:
                if tgid(pid) == victim:
                    print(f"held {pid}", flush=True)
                    continue
                reply(unique)
            elif op == RELEASE:
                reply(unique)
            else:
                reply(unique, error=errno.ENOSYS)
    finally:
        subprocess.run(["fusermount3", "-u", "-z", "--", where], check=False)


if __name__ == "__main__":
    main()
