"""The launcher of an agent's rootless podman API service (run by the daemon
as `python -m leviathd.enginesock.rootless_exec`, as root, already moved into
the agent's scope by the daemon before it reads its orders on stdin).

It takes what only the engine gets from the machine's view (its folders, the
id mappers, device nodes: enginesock/engineroot.py), waits for the agent's
fence to run, enters that fence's mount namespace and makes, from it, the
engine's own mount namespace and PID namespace (issue 43: the engine sees
what the agent sees). PID 1 there is this launcher's child: it builds the
root, starts the service as the agent's user, reaps what is orphaned, and
ends (and with it, by the kernel, every process of the engine: pause
process, conmon, containers, builds) when the service ends, when it is
asked to stop, or once both the fence it entered and the agent's
supervisor have ended (an end while the daemon was away).

The service gets the listening socket the daemon bound (fd 3) by systemd's
socket activation protocol (LISTEN_FDS/LISTEN_PID): podman never binds,
names or sees a path the agent could reach.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
import time

from leviathd.enginesock import engineroot

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
LISTEN_FD = 3
MAX_ORDERS = 64 * 1024
MAX_STATUS = 64 * 1024
# How long the engine waits for the agent's fence to run (seed steps first).
FENCE_WAIT = 600.0
FENCE_POLL = 0.05

_libc = ctypes.CDLL(None, use_errno=True)


_SIOCGSKNS = 0x894C


def _net_ino() -> int:
    """The inode of the network namespace this process is in now, from a
    socket made in it (the /proc seen after entering the fence is the
    fence's, where this process has no /proc/self)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        fd = fcntl.ioctl(s.fileno(), _SIOCGSKNS)
    try:
        return os.fstat(fd).st_ino
    finally:
        os.close(fd)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(MAX_STATUS)


def _is_fence(pid: int, own: dict[str, int]) -> bool:
    """PID 1 of a PID namespace of its own that the daemon made (the
    machine's user namespace: an agent cannot make one without a user
    namespace of its own), in a mount namespace that is not the machine's,
    and finished: it is the agent's user now. It builds its root as root
    (sandbox/namespace/pid1.py), pivots, then adds the protected files'
    read-only binds (guard.apply), and only then gives up root, for good;
    entered any earlier, the engine's copy would lack some of the fence's
    mounts or be the machine's root."""
    fields = {k: v.strip() for k, _, v in (line.partition(":") for line in
                                           _read(f"/proc/{pid}/status").splitlines())}
    nspid = fields.get("NSpid", "").split()
    uids = fields.get("Uid", "0").split()
    return (len(nspid) >= 2 and nspid[-1] == "1" and "0" not in uids
            and os.stat(f"/proc/{pid}/ns/user").st_ino == own["user"]
            and os.stat(f"/proc/{pid}/ns/mnt").st_ino != own["mnt"]
            and os.stat(f"/proc/{pid}/ns/pid").st_ino != own["pid"])


def find_fence(procs: str, deadline: float) -> int:
    """A pidfd on the agent's running fence's PID 1, found among the
    processes of the agent's scope (`procs`: its cgroup.procs); waits for it
    (the daemon starts the engine before it releases the agent)."""
    own = {n: os.stat(f"/proc/self/ns/{n}").st_ino for n in ("user", "mnt", "pid")}
    me = os.getpid()
    while True:
        words: list[str] = []
        # The scope's and its children's (a container agent's init is below it).
        for folder, _dirs, files in os.walk(os.path.dirname(procs)):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError):
                    words += _read(os.path.join(folder, "cgroup.procs")).split()
        for word in words:
            pid = int(word)
            if pid == me:
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if _is_fence(pid, own):
                    # What was read is of the process the pidfd names only if
                    # it still lives now (its pid was not reused meanwhile).
                    signal.pidfd_send_signal(pidfd, 0)
                    return pidfd
            except (OSError, ValueError):
                pass
            os.close(pidfd)
        if time.monotonic() > deadline:
            raise OSError(errno.ETIMEDOUT, "the agent's fence never ran")
        time.sleep(FENCE_POLL)


def _service(orders: dict[str, object]) -> None:
    """In the engine's root, as its PID namespace's PID 2: become the agent's
    user for good and exec podman's service. Never returns."""
    uid, gid = int(str(orders["uid"])), int(str(orders["gid"]))
    groups = [int(g) for g in orders["groups"]]  # type: ignore[attr-defined]
    argv = [str(a) for a in orders["argv"]]  # type: ignore[attr-defined]
    env = {str(k): str(v) for k, v in orders["env"].items()}  # type: ignore[attr-defined]
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        os._exit(2)
    # podman's own messages, written as the user into its runtime folder.
    log = os.open(str(orders["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                  | os.O_CLOEXEC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.set_inheritable(LISTEN_FD, True)
    os.chdir(str(orders["cwd"]))
    # The protocol names the process that is to take the descriptors: this
    # one (as its PID namespace numbers it), which exec keeps.
    env["LISTEN_FDS"] = "1"
    env["LISTEN_PID"] = str(os.getpid())
    os.execve(argv[0], argv, env)


def _init(orders: dict[str, object], parts: engineroot.MachineParts, watched: list[int]) -> int:
    """PID 1 of the engine's PID namespace: its root, its service, its end."""
    engineroot.build(parts)
    parts.close()
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    # PID 1 of a namespace takes no signal it has no handler for: asked to
    # stop (the scope's stop), it ends at once, and the kernel ends the rest.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    service = os.fork()
    if service == 0:
        try:
            for fd in (wake_r, wake_w, *watched):
                os.close(fd)
            _service(orders)
        except BaseException as exc:  # into podman's log, or the daemon's journal
            with contextlib.suppress(OSError):
                os.write(2, f"leviathd engine: {exc}\n".encode())
        finally:
            os._exit(2)
    poller = select.poll()
    poller.register(wake_r, select.POLLIN)
    for fd in watched:
        poller.register(fd, select.POLLIN)
    alive = set(watched)
    while True:
        for fd, _ev in poller.poll():
            if fd == wake_r:
                with contextlib.suppress(OSError):
                    os.read(wake_r, 512)
            elif fd in alive:
                alive.discard(fd)
                poller.unregister(fd)
                if not alive:
                    return 0  # the agent is gone: nothing of its engine stays
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return 2
            if pid == 0:
                break
            if pid == service:
                return os.waitstatus_to_exitcode(status) & 0xFF


def main() -> int:
    raw = sys.stdin.buffer.readline(MAX_ORDERS)
    if not raw.endswith(b"\n"):
        return 2  # the daemon went away before it gave the orders
    orders = json.loads(raw)
    if int(orders["uid"]) == 0 or int(orders["gid"]) == 0:
        return 2  # never root's engine: that is what this whole design avoids
    # The daemon's network namespace, the machine's: the engine of an agent
    # without the host's network must end up anywhere but there.
    host_net = _net_ino()
    sock = int(orders["fd"])
    if sock != LISTEN_FD:
        os.dup2(sock, LISTEN_FD)
        os.close(sock)
    os.set_inheritable(LISTEN_FD, False)
    watched: list[int] = []
    # The agent's supervisor, unless it has handed the agent over to its
    # fence's PID 1 and left already.
    with contextlib.suppress(ProcessLookupError):
        watched.append(os.pidfd_open(int(orders["supervisor"])))
    # The machine's mount namespace, not the daemon's (private to its unit:
    # ProtectSystem= and friends): the engine's parts come from there.
    ns = os.open("/proc/1/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(ns, CLONE_NEWNS), "setns(/proc/1/ns/mnt)")
    finally:
        os.close(ns)
    parts = engineroot.machine_parts(str(orders["run"]), str(orders["storage"]),
                                     [str(p) for p in orders["mappers"]],
                                     [str(p) for p in orders.get("system", [])])
    fence = find_fence(str(orders["procs"]), time.monotonic() + FENCE_WAIT)
    watched.append(fence)
    # Nothing is imported from here on: the root becomes the agent's.
    sys.path[:] = []
    sys.path_importer_cache.clear()
    _check(_libc.setns(fence, CLONE_NEWNS), "setns(the agent's fence)")
    if orders.get("fence_network"):
        # network = "proxy": the agent's own network namespace (only lo, its
        # proxy's listener there), so the engine and the containers it puts
        # on that network get no route the agent does not have (issue 49).
        _check(_libc.setns(fence, CLONE_NEWNET), "setns(the agent's network)")
    flags = CLONE_NEWNS | CLONE_NEWPID | (CLONE_NEWNET if orders.get("private_network", True)
                                          else 0)
    _check(_libc.unshare(flags), "unshare")
    if orders.get("private_network", True):
        # An agent without the host's network gets an engine without it:
        # pulls, builds' RUN steps and every container's slirp4netns or
        # pasta reach nothing outside.
        loopback_up()
    if ((orders.get("fence_network") or orders.get("private_network", True))
            and _net_ino() == host_net):
        # Its containers share this namespace behind the proxy (rules.py's
        # NetworkMode host): never the machine's network.
        raise OSError(errno.EPERM, "the engine is still in the host's network namespace")
    init = os.fork()
    if init == 0:
        code = 2
        try:
            code = _init(orders, parts, watched)
        except BaseException as exc:  # said where the daemon's message points
            with contextlib.suppress(OSError):
                os.write(2, f"leviathd engine: {exc}\n".encode())
        finally:
            os._exit(code)
    # The socket is the engine's alone: once it ends, a client is refused.
    parts.close()
    for fd in (*watched, LISTEN_FD):
        os.close(fd)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(init, signal.SIGTERM))
    while True:
        try:
            _pid, status = os.waitpid(init, 0)
            return os.waitstatus_to_exitcode(status) & 0xFF
        except InterruptedError:
            continue


if __name__ == "__main__":
    sys.exit(main())
