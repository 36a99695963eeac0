"""The programs the daemon puts first on an agent's PATH (creds/service.py
writes them as two-line scripts into the agent's socket folder, which the
sandbox shows read-only at /run/leviath):

- `git-credential-leviath get`: git's credential helper (gitcredentials(7)).
  It asks the broker for the token of the URL git names and prints it in
  git's format; `store` and `erase` do nothing (the broker keeps nothing the
  agent could change).
- `run NAME ARGS...`: the wrapper of a `kind = "cli"` credential (gh, glab,
  ...): the broker runs the real CLI in the credential fence with the token,
  and this prints its output and exits with its status.

Both run as the agent, inside its sandbox: they hold no secret of their own
and decide nothing; the broker decides."""

from __future__ import annotations

import os
import sys
from typing import Any

from leviathd.cli.tool import BrokerClient
from leviathd.errors import LeviathError

# What git sends a helper: a few short lines. More is not git.
MAX_INPUT = 64 * 1024
# How far up the process tree a `git push` may be: helper, (sh -c), git-remote-https, git.
MAX_DEPTH = 6


def read_request(data: bytes) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in data[:MAX_INPUT].decode("utf-8", "replace").split("\n"):
        if not line:
            break
        key, sep, value = line.partition("=")
        if sep and key in ("protocol", "host", "path", "username"):
            fields[key] = value
    return fields


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read(8192).split(b"\0") if a]
    except OSError:
        return []


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096)
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def started_by_push(pid: int | None = None) -> bool:
    """Whether a `git push` (or send-pack) started this helper: a hint to
    ask for the push token, not a check (the agent could run either)."""
    pid = os.getppid() if pid is None else pid
    for _ in range(MAX_DEPTH):
        if pid <= 1:
            return False
        argv = _cmdline(pid)
        prog = os.path.basename(argv[0]) if argv else ""
        if prog == "git-send-pack" or (prog == "git" and _subcommand(argv[1:]) in (
                "push", "send-pack")):
            return True
        pid = _parent(pid)
    return False


# git's options that take the next word as their value.
_VALUED = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace",
                     "--super-prefix", "--config-env"})


def _subcommand(args: list[str]) -> str:
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in _VALUED:
            skip = True
        elif not a.startswith("-"):
            return a
    return ""


def git_credential(op: str, stdin: bytes, *, push: bool | None = None) -> tuple[int, str, str]:
    """(status, stdout, stderr) of one helper call."""
    if op != "get":
        return 0, "", ""
    req = read_request(stdin)
    protocol, host = req.get("protocol", ""), req.get("host", "")
    if protocol not in ("http", "https") or not host:
        return 0, "", ""  # not ours to answer: git asks its next helper, or the user
    url = f"{protocol}://{host}/{req.get('path', '')}"
    tool = "git_push" if (started_by_push() if push is None else push) else "git_fetch"
    reply = _call(tool, {"url": url})
    if not reply.get("ok"):
        err = reply.get("error") or {}
        # git goes on without a token (a public repo still works) and shows this.
        msg = f"leviath: {tool} {url[:200]}: {str(err.get('message', 'refused'))[:300]}\n"
        return 0, "", msg
    result = reply.get("result") or {}
    user, token = str(result.get("username", "")), str(result.get("password", ""))
    if not token or any(c in user + token for c in "\n\0"):
        return 0, "", "leviath: the broker's answer is not usable by git\n"
    return 0, f"username={user}\npassword={token}\n", ""


def _call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    client = BrokerClient()
    try:
        return client.call(tool, args)
    finally:
        client.close()


def run_wrapped(name: str, args: list[str]) -> int:
    reply = _call("credential", {"name": name, "args": args})
    if not reply.get("ok"):
        err = reply.get("error") or {}
        sys.stderr.write(f"leviath: {name}: {err.get('code', 'error')}: "
                         f"{str(err.get('message', 'refused'))[:500]}\n")
        return 126
    result = reply.get("result") or {}
    sys.stdout.write(str(result.get("stdout", "")))
    sys.stdout.flush()
    sys.stderr.write(str(result.get("stderr", "")))
    status = int(result.get("exit_status", 1))
    return status if 0 <= status < 256 else 1


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["git-credential"] and len(argv) >= 2:
            status, out, err = git_credential(argv[1], sys.stdin.buffer.read(MAX_INPUT))
            sys.stdout.write(out)
            sys.stderr.write(err)
            return status
        if argv[:1] == ["run"] and len(argv) >= 2:
            return run_wrapped(argv[1], argv[2:])
    except LeviathError as exc:
        sys.stderr.write(f"leviath: {exc}\n")
        return 0 if argv[:1] == ["git-credential"] else 126
    sys.stderr.write("usage: python -m leviathd.cli.credhelper git-credential get|store|erase"
                     " | run NAME ARGS...\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
