"""The broker's side of a credential command (`[credentials.NAME]` of kind
"command" or "cli"): the secret read (as root for the machine config's, as
the agent's user for a user's own), the command and its scrubbed
environment built, the run handed to the daemon's fenced runner
(`CredentialRunner`: gate/service.py `run_credential` with
creds/command.py), the secret cut out of what comes back. Here in broker/
because the broker runs it and may not import the services (creds/); see
docs/architecture.md "Where credentials live"."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from leviathd import fdclose
from leviathd.broker.opener import Opener
from leviathd.broker.tools import MAX_READ, read_all
from leviathd.domain.credentials import SAFE_PATH, CredentialSpec
from leviathd.errors import InvalidArgument, NotFound, Unavailable
from leviathd.sandbox import privileges

_READ_FLAGS = os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK  # NONBLOCK: a FIFO cannot hang us


def _guarded(uid: int, gid: int, groups: Sequence[int]) -> Callable[[], None]:
    """The credential command's `preexec_fn`: the usual drop to the user
    (privileges.user_command), such that the user cannot read the secret
    from /proc (environ, mem, fd) nor ptrace the process.

    The kernel lets a process of the same uid in only when the caller's gid
    equals the target's real, effective and saved gids, and then only when
    the target is dumpable. So the real gid is one the user cannot take
    (nogroup's, never theirs): the process and every process it execs fail
    the first test, and exec makes them non-dumpable too (real gid !=
    effective gid), which PR_SET_DUMPABLE cannot do across an exec. The
    effective gid stays the user's, so files it writes are the user's as
    ever. (A shell may reset its effective gid to the real one at start;
    all its gids are then nogroup's, which still keeps the user out.)"""
    drop = privileges.user_command(
        uid, gid, groups, real_gid=_NOGROUP if gid != _NOGROUP else _NOGROUP - 1
    )

    def become() -> None:
        drop()
        _set_dumpable(False)

    return become


_NOGROUP = 65534
_PR_SET_DUMPABLE = 4


def _set_dumpable(on: bool) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 1 if on else 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


async def _secret_from_command(
    argv: Sequence[str], *, uid: int, gid: int, groups: Sequence[int], home: str, as_root: bool,
    timeout: float = 30.0,
) -> str:
    """The standard output of `secret_command`, stripped. Its output and
    errors are never shown to the agent: a failure is reported by status."""
    switch: dict[str, Any] = {}
    if as_root:
        switch = {"preexec_fn": privileges.root_command}
    elif os.geteuid() == 0:
        switch = {"preexec_fn": _guarded(uid, gid, groups)}
    elif uid != os.geteuid():
        raise Unavailable("the broker must run as root to act for another user")
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root" if as_root else home,
                 "LANG": "C.UTF-8"},
            cwd="/", **switch,
        )
    except OSError as exc:
        raise NotFound(f"cannot run the credential's secret_command: {exc.strerror}") from None
    except subprocess.SubprocessError:
        raise Unavailable("cannot drop privileges for the credential's secret_command") from None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise Unavailable(f"secret_command timed out after {timeout:.0f}s") from None
    if proc.returncode != 0:
        raise Unavailable(f"secret_command failed with status {proc.returncode}")
    return out[:MAX_READ].decode("utf-8", "replace").strip()


# A line of a multi-line secret shorter than this is not redacted alone
# (it would blank out common words); the whole secret still is.
MIN_REDACTED_LINE = 6


def redact(text: str, secret: str) -> str:
    """Exact copies of the secret, and of each line of a secret of several
    lines (a program given `a\nb` as its token may print only `a`: seen
    with the wrapped `gh auth token`), longest first."""
    if not secret:
        return text
    parts = {secret, *(ln.strip() for ln in secret.splitlines()
                       if len(ln.strip()) >= MIN_REDACTED_LINE)}
    for part in sorted(parts, key=len, reverse=True):
        text = text.replace(part, "[redacted]")
    return text


@dataclass(frozen=True)
class CredentialRequest:
    """One credential command for the daemon's fence (gate_service.run_credential):
    `env` is its whole environment but HOME/USER/LOGNAME; `stdin` its secret."""

    agent_id: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    stdin: str
    workdir: Literal["none", "ro"]
    timeout: float


CredentialRunner = Callable[[CredentialRequest], Awaitable[Mapping[str, Any]]]
# A secret is handed over in one pipe buffer (gate_shell.MAX_STDIN).
MAX_SECRET = 60 * 1024 - 1


async def run_credential(
    spec: CredentialSpec,
    args: Sequence[str],
    *,
    opener: Opener,
    uid: int,
    gid: int,
    groups: Sequence[int],
    home: str,
    agent_id: str,
    runner: CredentialRunner | None,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Run the configured command with the secret on its standard input (a
    pipe, closed after the secret and a newline), never in its environment
    or arguments. The secret comes from `secret_file` or `secret_command`:
    as root for a credential of the machine config (the admin's secret, which
    the agent's user need not be able to read), as the agent's user for a
    user's own credential (so a user config cannot point it at a file only
    root may read). The command runs as the agent's user through `runner`:
    in the agent's scope, in a fence of its own with a private home and
    working folder and a scrubbed environment (creds/fence.py),
    with a real gid its user cannot take (see `_guarded`); never here,
    outside every fence. The secret is cut out of its output."""
    if spec.kind not in ("command", "cli"):
        raise InvalidArgument(
            f"a credential of kind {spec.kind!r} is not a command: the sandbox's "
            + {"git": "git credential helper", "ssh": "SSH agent"}.get(
                spec.kind, "proxy (injected at the egress)") + " uses it"
        )
    if not spec.command:
        raise Unavailable("credential has no command configured")
    if spec.env:
        raise InvalidArgument(
            f"the credential sets env = {spec.env!r}: secrets no longer reach the command in "
            "its environment (its user could read it from /proc); the command reads the "
            "secret from its standard input instead (see docs/configuration.md)"
        )
    if runner is None:
        raise Unavailable("credential commands need the daemon's fence, which this broker lacks")
    secret = await read_secret(spec, opener=opener, uid=uid, gid=gid, groups=groups, home=home)
    env = {
        "PATH": SAFE_PATH,
        "LANG": "C.UTF-8",
        # git reads no /etc/gitconfig, asks no one, and takes nothing from the
        # agent's folders (the fence shows none of them but a read-only workdir).
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
    }
    argv: tuple[str, ...] = (*spec.command, *args)
    if spec.kind == "cli":
        # The wrapped CLI reads its token from a variable: the fence's shell
        # moves it there from stdin. The variable is as safe as the pipe: the
        # fence's processes are out of its user's reach (`_guarded`), and its
        # PID namespace hides them from the agent. The name was validated.
        argv = ("/bin/sh", "-c", f'IFS= read -r t; {spec.token_env}="$t"; '
                f'export {spec.token_env}; unset t; exec "$@"', "sh", *argv)
    out = await runner(CredentialRequest(
        agent_id, argv, env, secret + "\n", spec.workdir, timeout,
    ))
    return {
        "exit_status": int(out.get("exit_status", -1)),
        "stdout": redact(str(out.get("stdout", ""))[:MAX_READ], secret),
        "stderr": redact(str(out.get("stderr", ""))[:MAX_READ], secret),
    }


async def read_secret(
    spec: CredentialSpec, *, opener: Opener, uid: int, gid: int, groups: Sequence[int],
    home: str,
) -> str:
    """The credential's secret: as root for a credential of the machine
    config, as the agent's user for a user's own (see `run_credential`)."""
    as_root = spec.from_machine and os.geteuid() == 0
    if spec.secret_command:
        secret = await _secret_from_command(
            spec.secret_command, uid=uid, gid=gid, groups=groups, home=home, as_root=as_root
        )
    else:
        try:
            if as_root:
                fd = os.open(spec.secret_file, _READ_FLAGS | os.O_CLOEXEC)
            else:
                fd = await asyncio.to_thread(opener.open, spec.secret_file, _READ_FLAGS)
        except OSError as exc:
            raise NotFound(f"cannot read the credential's secret file: {exc.strerror}") from None
        try:
            secret = (await asyncio.to_thread(_read_held, fd)).decode().strip()
        finally:
            # A user's secret file may be on her own FUSE mount, whose server
            # decides when a close returns: never on the loop (fdclose.py).
            fdclose.discard(fd)
    if len(secret.encode()) > MAX_SECRET:
        raise InvalidArgument(f"the credential's secret is larger than {MAX_SECRET} bytes")
    return secret


def _read_held(fd: int) -> bytes:
    """read_all of a secret file a user named: cut off if her FUSE server
    holds the read (fdclose.cut_off_if_held)."""
    with fdclose.cut_off_if_held(fd):
        return read_all(fd)
