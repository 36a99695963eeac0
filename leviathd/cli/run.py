"""`lev run BLUEPRINT|-- COMMAND...`: start an agent through leviathd. Attached
by default: the agent writes to this terminal (and the journal), `lev` exits
with its status, and Ctrl-C stops it."""

from __future__ import annotations

import os
import select
import sys

from leviathd.cli.wire import DaemonError, Slow, SyncClient, Variant
from leviathd.errors import InvalidArgument, NotFound

# typing imports re; mypy reads any TYPE_CHECKING as true (issue 18: start-up).
TYPE_CHECKING = False
if not TYPE_CHECKING:
    # The signal module's C half (the same functions, plain ints): the Python
    # half makes enums of every signal, a tenth of `lev run`'s imports.
    import _signal as signal
if TYPE_CHECKING:
    import argparse
    import signal
    from collections.abc import Awaitable
    from typing import Any

    from leviathd.cli.client import Client

# How often an attached run asks after its agent when no end signal came: the
# last resort, should the bus refuse our match on the daemon's name.
POLL_SECONDS = 5.0
ACTIVE = ("running", "unknown")


def _poll_seconds() -> float:
    """LEVIATH_POLL_SECONDS, within 0.1-3600 s (the tests set it high to show
    that the end is heard, not found by asking)."""
    try:
        return min(max(float(os.environ.get("LEVIATH_POLL_SECONDS", POLL_SECONDS)), 0.1), 3600.0)
    except ValueError:
        return POLL_SECONDS


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run", help="start an agent from a blueprint or a command (attached by default)",
        usage="lev run [options] (BLUEPRINT | -- COMMAND...)",
        description="Start an agent as you, fenced. Options go anywhere before `--`: "
        "lev run reviewer --workdir ~/src/app, lev run --detach -- make test.",
    )
    p.add_argument("--workdir", "-w", metavar="DIR",
                   help="the agent's working directory (default: here)")
    p.add_argument("--detach", "-d", action="store_true",
                   help="print the agent's id (and its unit on stderr) and return")
    p.add_argument(
        "--workdir-mode", choices=("rw", "ro", "throwaway"), default="rw",
        help="workdir read-write (default), read-only, or under a throwaway layer",
    )
    p.add_argument(
        "--no-sandbox", action="store_true",
        help="run without a sandbox (needs polkit action org.leviath.agent.run-unsandboxed)",
    )
    p.add_argument(
        "blueprint", nargs="?", metavar="BLUEPRINT",
        help="an installed agent's name (lev add, lev list), or a blueprint folder or file",
    )
    # What follows `--` is split off before parsing (main.split_command), so
    # options may come before or after BLUEPRINT and never reach the command.
    p.set_defaults(func=main, command_argv=None)


_NAME_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_NAME_REST = _NAME_FIRST | {"_", "-"}


def is_name(arg: str) -> bool:
    """What safetext.NAME_RE.match says (its `$` lets one final newline
    through, so this does too), without importing re, which with pathlib
    was a third of `lev run BLUEPRINT`'s imports (issue 18; test_cli_run
    holds the two to the same answers)."""
    body = arg[:-1] if arg.endswith("\n") else arg
    return (0 < len(body) <= 64 and body[0] in _NAME_FIRST
            and all(c in _NAME_REST for c in body[1:]))  # fmt: skip


def blueprint_file(arg: str) -> str:
    """An installed agent's name, or a path (a folder holding blueprint.toml,
    or the file itself). Told apart by syntax alone: a bare name (the
    blueprint name rules) is only ever the installed agent, so a folder of
    that name planted in the current directory is never picked up; a folder
    here is given as a path, `./NAME`."""
    if is_name(arg):
        store = os.environ.get("LEVIATH_AGENT_STORE") or os.path.join(
            os.path.expanduser("~"), ".local", "share", "leviath", "agents"
        )
        candidate = os.path.join(store, arg, "blueprint.toml")
        if os.path.isfile(candidate):
            return candidate
        hint = f"; for the folder here, say ./{arg}" if os.path.exists(arg) else ""
        raise NotFound(f"no installed agent named {arg!r} (see `lev list`){hint}")
    path = arg
    if os.path.isdir(path):
        path = os.path.join(path, "blueprint.toml")
    if os.path.isfile(path):
        return os.path.realpath(path)
    from leviathd.safetext import escape

    raise NotFound(f"no blueprint at {escape(arg, 200)!r}")


def _utf8(value: str, what: str) -> str:
    """D-Bus strings are UTF-8: a name that is not (a file named with stray
    bytes) is refused here, with its bytes shown escaped."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        from leviathd.safetext import escape

        raise InvalidArgument(f"{what} is not valid UTF-8: {escape(value, 200)}") from None
    return value


def _utf8_env() -> dict[str, str]:
    # The agent's environment is filtered by name anyway: what cannot cross
    # the bus is left out rather than refused.
    env = {}
    for k, v in os.environ.items():
        try:
            k.encode("utf-8")
            v.encode("utf-8")
        except UnicodeEncodeError:
            continue
        env[k] = v
    return env


def build_request(args: argparse.Namespace) -> dict[str, Variant]:
    command: list[str] | None = args.command_argv
    workdir = _utf8(os.path.abspath(args.workdir or os.getcwd()), "the workdir")
    req: dict[str, Variant] = {
        "workdir": Variant("s", workdir),
        "env": Variant("a{ss}", _utf8_env()),
        "workdir_mode": Variant("s", args.workdir_mode),
    }
    if args.no_sandbox:
        req["sandbox"] = Variant("s", "none")
    if command is not None and args.blueprint is not None:
        from leviathd.safetext import escape

        raise InvalidArgument(
            "give a blueprint or -- and a command, not both "
            f"(blueprint {escape(args.blueprint, 80)!r})"
        )
    if command is not None:
        if not command:
            raise InvalidArgument("nothing to run after -- (lev run -- make test)")
        req["command"] = Variant("as", [_utf8(a, "the command") for a in command])
    elif args.blueprint is not None:
        path = blueprint_file(args.blueprint)
        # Read here, as the user: the daemon never opens a path a client names.
        with open(path, encoding="utf-8") as f:
            req["blueprint"] = Variant("s", f.read())
        req["blueprint_source"] = Variant("s", os.path.abspath(path))
    else:
        raise InvalidArgument(
            "nothing to run: give a blueprint (lev run my-agent) or -- and a command "
            "(lev run -- make test)"
        )
    return req


# On a terminal, a start slower than this says what it waits for.
PROGRESS_AFTER = 1.0


async def _shown_if_slow(call: Awaitable[list[Any]]) -> list[Any]:
    """The daemon's reply to Run/RunAttached; on a terminal, a line on stderr
    when it takes longer than PROGRESS_AFTER, so a slow start (a container
    engine starting, a big fence) is not a silent pause."""
    import asyncio

    task = asyncio.ensure_future(call)
    if not os.isatty(2):
        return await task
    done, _ = await asyncio.wait({task}, timeout=PROGRESS_AFTER)
    if not done:
        print("lev: waiting for leviathd to start the agent: building its fence (or starting "
              "its container); nothing is downloaded", file=sys.stderr, flush=True)
    return await task


def _progress() -> Slow | None:
    """On a terminal, say so when the daemon takes over PROGRESS_AFTER to
    start the agent (once, however often a Busy start is asked again)."""
    if not os.isatty(2):
        return None
    said: list[bool] = []

    def say() -> None:
        if not said:
            said.append(True)
            print("lev: waiting for leviathd to start the agent: building its fence (or "
                  "starting its container); nothing is downloaded", file=sys.stderr, flush=True)

    return (PROGRESS_AFTER, say)


def _run(args: argparse.Namespace) -> int:
    req = build_request(args)
    if not args.detach and os.isatty(0):
        # On a terminal the agent's held tool calls are asked about here,
        # which needs the event loop; the short paths below do not.
        import asyncio

        return asyncio.run(_run_prompting(req))
    client = SyncClient()
    try:
        if args.detach:
            agent_id, unit = client.call_when_free("Run", "a{sv}", [req], on_slow=_progress())
            print(agent_id)
            print(f"unit {unit}", file=sys.stderr)
            return 0
        return _attached_sync(client, req)
    finally:
        client.close()


class _Output:
    """Pipes this `lev` makes for the agent's stdout and stderr and copies
    to its own: the daemon then copies the output itself, without a
    supervisor process, and a pipe made here is one whose reader is only
    us (issue 18). A `lev` that stops reading (stopped, or its terminal
    is) costs the agent nothing: the daemon drops what does not fit."""

    def __init__(self) -> None:
        self._pipes = [os.pipe2(os.O_CLOEXEC), os.pipe2(os.O_CLOEXEC)]
        import threading

        self._thread = threading.Thread(target=self._copy, name="output", daemon=True)
        self._thread.start()

    def fds(self) -> list[int]:
        """The write ends, for RunAttached (its stdout and stderr)."""
        return [w for _r, w in self._pipes]

    def sent(self) -> None:
        """The daemon has its copies (or refused): ours go, so the end of
        its copies is the end of the pipes."""
        for _r, w in self._pipes:
            if w >= 0:
                os.close(w)
        self._pipes = [(r, -1) for r, _w in self._pipes]

    def _copy(self) -> None:
        routes = {r: target for (r, _w), target in zip(self._pipes, (1, 2), strict=True)}
        while routes:
            for fd in select.select(list(routes), [], [])[0]:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    del routes[fd]
                    os.close(fd)
                    continue
                view = memoryview(data)
                try:
                    while view:
                        view = view[os.write(routes[fd], view):]
                except OSError:
                    pass  # our own output is closed: the journal still has it

    def finish(self, timeout: float = 7.0) -> None:
        """After the agent's end: what the daemon still sends (it drains
        the agent's pipes before it says the agent ended, and gives a slow
        reader a few seconds more)."""
        self.sent()
        self._thread.join(timeout)


def _attached_sync(client: SyncClient, req: dict[str, Variant]) -> int:
    # No AddMatch for the daemon's signals: they are unicast to this
    # connection, which the bus delivers whatever the rules (a rule filters
    # broadcasts only); each is still checked to be the daemon's.
    client.watch_restarts()
    out = _Output()
    try:
        agent_id, _unit = client.call_when_free(
            "RunAttached", "a{sv}hhh", [req, 0, 1, 2], unix_fds=[0, *out.fds()],
            on_slow=_progress(),
        )
    finally:
        out.sent()
    try:
        status, changed = _wait_attached(client, agent_id)
    finally:
        out.finish()
    _tell_hook_changes(agent_id, changed)
    return status


def _hook_changes(info: dict[str, Any]) -> list[str]:
    return [str(c) for c in info["hook_changes"].value] if "hook_changes" in info else []


def _tell_hook_changes(agent_id: str, changed: list[str]) -> None:
    """The last line of an attached run: what the agent changed in the hook
    files it was given (issue 48), which run on the host at the next commit:
    heard in the daemon's AgentHookChanges just before its AgentEnded, or
    read in the Watch reply that told the end (issue 47: no Get after it)."""
    if changed:
        print(f"lev: agent {agent_id} changed hook files that run on this host (read them "
              f"before your next commit): {', '.join(changed)}", file=sys.stderr, flush=True)


def _status(info: dict[str, Any]) -> int | None:
    """The exit status in a Get/Watch reply; None while the agent runs."""
    if info["state"].value in ACTIVE:
        return None
    return int(info["exit_status"].value) if "exit_status" in info else 1


def _watch(client: SyncClient, agent_id: str) -> dict[str, Any]:
    """Ask after the agent, and hear its end from now on (Watch); its
    record (_status: its exit status if it has ended already)."""
    try:
        (info,) = client.call("Watch", "s", [agent_id])
    except DaemonError as exc:  # a daemon from before Watch
        if exc.name != "org.freedesktop.DBus.Error.UnknownMethod":
            raise
        (info,) = client.call("Get", "s", [agent_id])
    return info  # type: ignore[no-any-return]


def _wait_attached(client: SyncClient, agent_id: str) -> tuple[int, list[str]]:
    """The agent's exit status, and the hook files it changed."""
    # Ctrl-C and SIGTERM stop the agent (once) and we go on waiting for its
    # end; the handlers only wake the wait below.
    interrupted: list[int] = []
    rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    old_wakeup = signal.set_wakeup_fd(wfd)
    handlers = {
        sig: signal.signal(sig, lambda signum, _frame: interrupted.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    client.conn.wakeup = rfd
    stop_sent = False
    changed: list[str] = []
    try:
        while True:
            if interrupted and not stop_sent:
                stop_sent = True
                client.call("Stop", "s", [agent_id])
            msg = client.conn.next_signal(_poll_seconds())
            if msg is None:
                if select.select([rfd], [], [], 0)[0]:
                    while True:
                        try:
                            if not os.read(rfd, 512):
                                break
                        except BlockingIOError:
                            break
                    continue
            elif not client.new_daemon(msg):
                if client.from_daemon(msg, "AgentEnded") and msg.body[0] == agent_id:
                    status = int(msg.body[1])
                    break
                if client.from_daemon(msg, "AgentHookChanges") and msg.body[0] == agent_id:
                    changed = [str(c) for c in msg.body[1]]
                continue
            # Nothing heard for a while, or the daemon restarted (and does
            # not know this connection): ask, and be told of the end.
            info = _watch(client, agent_id)
            got = _status(info)
            if got is not None:
                status, changed = got, _hook_changes(info)
                break
    finally:
        client.conn.wakeup = None
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        os.close(rfd)
        os.close(wfd)
    return (status if status >= 0 else 1), changed


async def _run_prompting(req: dict[str, Variant]) -> int:
    from dbus_fast import Variant as DVariant

    from leviathd.cli.client import Client

    client = await Client.connect()
    try:
        return await _attached(
            client, {k: DVariant(v.signature, v.value) for k, v in req.items()}
        )
    finally:
        client.close()


async def _attached(client: Client, req: dict[str, Any]) -> int:
    import asyncio

    from dbus_fast import Message

    ended: dict[str, int] = {}
    changes: dict[str, list[str]] = {}
    done = asyncio.Event()
    wanted: list[str] = []

    def on_signal(msg: Message) -> bool:
        if client.from_daemon(msg, "AgentEnded"):
            agent_id, status, _state = msg.body
            ended[agent_id] = status
            if agent_id in wanted:
                done.set()
        elif client.from_daemon(msg, "AgentHookChanges") and msg.body[0] in wanted:
            changes[str(msg.body[0])] = [str(c) for c in msg.body[1]]
        elif client.new_daemon(msg):
            restarted.set()
        return False

    restarted = asyncio.Event()
    client.bus.add_message_handler(on_signal)
    # (no AddMatch for AgentEnded: unicast, as in _attached_sync)
    await client.watch_restarts()
    prompter = None
    if os.isatty(0):  # held tool calls of this agent are asked about here
        from leviathd.cli.approvals import InlinePrompter

        prompter = InlinePrompter(client, wanted)
        await prompter.start()
    out = _Output()
    try:
        agent_id, _unit = await _shown_if_slow(client.call(
            "RunAttached", "a{sv}hhh", [req, 0, 1, 2], unix_fds=[0, *out.fds()]
        ))
    except BaseException:
        out.finish(0)
        raise
    out.sent()
    try:
        status = await _wait_attached_async(
            client, agent_id, wanted, ended, done, restarted, prompter, changes
        )
    finally:
        out.finish()
    _tell_hook_changes(agent_id, changes.get(agent_id, []))
    return status


async def _watch_async(client: Client, agent_id: str) -> dict[str, Any]:
    """As _watch, on the asyncio client."""
    from leviathd.cli.client import DaemonError as AioDaemonError

    try:
        (info,) = await client.call("Watch", "s", [agent_id])
    except AioDaemonError as exc:  # a daemon from before Watch
        if exc.name != "org.freedesktop.DBus.Error.UnknownMethod":
            raise
        (info,) = await client.call("Get", "s", [agent_id])
    return info  # type: ignore[no-any-return]


async def _wait_attached_async(
    client: Client, agent_id: str, wanted: list[str], ended: dict[str, int],
    done: Any, restarted: Any, prompter: Any, changes: dict[str, list[str]],
) -> int:
    import asyncio

    wanted.append(agent_id)
    if agent_id in ended:
        done.set()

    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[list[object]]] = []

    def interrupt() -> None:
        if not stopping:
            stopping.append(loop.create_task(client.call("Stop", "s", [agent_id])))

    loop.add_signal_handler(signal.SIGINT, interrupt)
    loop.add_signal_handler(signal.SIGTERM, interrupt)
    while not done.is_set():
        # Nothing heard for a while, or the daemon restarted (and does not
        # know this connection): ask, and be told of the end.
        heard = asyncio.ensure_future(done.wait())
        renamed = asyncio.ensure_future(restarted.wait())
        await asyncio.wait((heard, renamed), timeout=_poll_seconds(),
                           return_when=asyncio.FIRST_COMPLETED)
        heard.cancel()
        renamed.cancel()
        if done.is_set():
            break
        restarted.clear()
        info = await _watch_async(client, agent_id)
        got = _status(info)
        if got is not None:
            ended[agent_id] = got
            changes[agent_id] = _hook_changes(info)
            break
    if prompter is not None:
        prompter.stop()
    status = ended.get(agent_id, 1)
    return status if status >= 0 else 1


def main(args: argparse.Namespace) -> int:
    return _run(args)
