"""leviathd: the system service. Wires the bus, systemd, the agent registry and
the control API together, then serves until told to stop. Agents are not the
daemon's: their scopes are systemd's, so they outlive a restart."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import syslog

from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus
from dbus_fast.constants import NameFlag, RequestNameReply

from leviathd import heap
from leviathd.agents import feature as features
from leviathd.agents.service import Agents
from leviathd.bus import caller, writer
from leviathd.bus.bounded import BoundedBus
from leviathd.bus.caller_watch import BusCallerWatch
from leviathd.bus.compat import many_fds
from leviathd.bus.manager_iface import ManagerInterface
from leviathd.bus.method import ServedAuthority
from leviathd.bus.names import BUS_NAME, MANAGER_IFACE, OBJECT_PATH
from leviathd.bus.policy_iface import PolicyInterface
from leviathd.config import load as config_load
from leviathd.config.machine_policy import MachinePolicy
from leviathd.config.reload import Cause, Reloads
from leviathd.config.watch import ConfigWatcher
from leviathd.creds.command import command_spec
from leviathd.creds.service import CredentialService
from leviathd.enginesock.service import EngineSockService
from leviathd.errors import ConfigError, LeviathError
from leviathd.events import Event
from leviathd.gate.answers import Answers
from leviathd.gate.service import GateService
from leviathd.metricsfile import MetricsFile
from leviathd.paths import machine_config_path, state_dir
from leviathd.proxy.service import ProxyService
from leviathd.records import RecordStore
from leviathd.systemd import absent, journal, notify
from leviathd.systemd.manager import SystemdManager

log = logging.getLogger("leviathd")


async def own_name(bus: MessageBus, *, patience: float = 5.0) -> bool:
    """Take the bus name. A daemon killed a moment ago may still hold it until
    the bus daemon has noticed its socket close, so wait a little for that
    rather than fail the restart."""
    deadline = asyncio.get_running_loop().time() + patience
    while True:
        reply = await bus.request_name(BUS_NAME, NameFlag.DO_NOT_QUEUE)
        if reply is RequestNameReply.PRIMARY_OWNER:
            return True
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.1)


# Exit status when the bus connection is lost: a failure, so that systemd
# restarts the daemon (Restart=) and the agents are adopted by the next one.
EXIT_BUS_LOST = 75
# `leviathd --check-config` on a machine config that does not load (EX_CONFIG).
EXIT_CONFIG = 78


async def connect(*, patience: float = 10.0) -> MessageBus:
    """Connect to the system bus; right after `systemctl restart dbus` the
    socket may refuse for a moment."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    while True:
        try:
            bus = BoundedBus(bus_type=BusType.SYSTEM, negotiate_unix_fd=True)
            return await many_fds(bus).connect()
        except OSError as exc:
            if loop.time() >= deadline:
                raise LeviathError(f"cannot connect to the system bus: {exc}") from None
            await asyncio.sleep(0.2)


def _unicast(
    bus: MessageBus, to: str | None, member: str, signature: str, body: list[object]
) -> None:
    if not to:
        return
    bus.send(Message(
        message_type=MessageType.SIGNAL, destination=to, path=OBJECT_PATH,
        interface=MANAGER_IFACE, member=member, signature=signature, body=body,
    ))  # fmt: skip


async def serve() -> int:
    writer.install()
    bus = await connect()
    caller.install(bus)
    systemd_booted = absent.booted()
    systemd: SystemdManager
    if systemd_booted:
        systemd = SystemdManager(bus)
        await systemd.attach()
    else:
        # No systemd as PID 1: no scopes, units or journald. Agents still run,
        # each in a podman container (see systemd/absent.py).
        systemd = absent.NoSystemd(bus)
        journal.record(
            absent.NOTICE.format(logs=journal.logs_dir()),
            priority=syslog.LOG_WARNING, LEVIATH_EVENT=Event.NO_SYSTEMD,
        )
    store = RecordStore(state_dir())
    store.ensure()

    # AgentStarted and AgentEnded go only to the connection that started the
    # agent (docs/security-model.md): broadcast, they told every local user
    # who runs which agent and how it ended.
    def started(agent_id: str, unit: str, uid: int, *, to: str | None = None) -> None:
        _unicast(bus, to, "AgentStarted", "ssu", [agent_id, unit, uid])

    def ended(agent_id: str, status: int, state: str, *, to: str | None = None,
              hook_changes: list[str] | None = None) -> None:
        if hook_changes:
            # Just before the end (one sender's messages to one connection
            # arrive in order): an attached `lev run` tells them without
            # asking with Get (issue 47).
            _unicast(bus, to, "AgentHookChanges", "sas", [agent_id, hook_changes])
        _unicast(bus, to, "AgentEnded", "sis", [agent_id, status, state])

    agents = Agents(
        BusCallerWatch(bus), systemd, store,
        # The Authority of the bus call being served, limited to what its
        # method declares (bus/method.py).
        authority=ServedAuthority(),
        machine_config_path=str(machine_config_path()),
        scratch_dir_default=os.path.join(state_dir(), "scratch"),
        on_started=started, on_ended=ended,
    )
    agents.podman_only = not systemd_booted

    # Every reload, whatever asked for it, goes this one way (config/reload.py).
    reloads = Reloads(agents.load_machine_config, str(machine_config_path()))

    def on_file_change() -> None:
        with contextlib.suppress(LeviathError):  # said in the journal
            reloads.reload(Cause.FILE)

    # Watching before the read and long before READY=1: an edit made the
    # moment `systemctl restart` returns is then seen, by the read or the watch.
    watcher = ConfigWatcher(str(machine_config_path()), on_file_change)
    watcher.start()
    rules_watcher = ConfigWatcher(str(config_load.machine_rules_dir(machine_config_path())),
                                  on_file_change, suffix=".toml")
    rules_watcher.start()
    try:
        agents.load_machine_config()
    except ConfigError as exc:
        # Serve anyway, in the strictest mode there is: no agent starts (so no
        # setting can be looser than the admin meant), while running agents
        # can still be listed and stopped. Exiting instead would leave every
        # `lev` call waiting out a 25 s activation timeout: systemd does not
        # report a failed start to the bus daemon.
        agents.config_problem = (
            f"the machine configuration does not load, so no agent starts until it is "
            f"fixed: {exc}"
        )
        log.error("%s", agents.config_problem)
    gate = GateService(agents, state_dir=state_dir(), credential_spec=command_spec)
    # The per-agent features (agents/feature.py), called in this order: the
    # others use the gate's folder and broker, so it comes first.
    agents.use([
        gate,
        CredentialService(agents, gate),
        ProxyService(agents, gate, state_dir=state_dir()),
        EngineSockService(agents, gate, state_dir=state_dir()),
    ])
    iface = ManagerInterface(bus, agents, reloads)
    bus.export(OBJECT_PATH, iface)
    machine_policy = MachinePolicy(machine_config_path(), lambda: agents.machine_config, reloads)
    bus.export(OBJECT_PATH, PolicyInterface(bus, agents, gate, Answers(gate), machine_policy))
    await agents.recover()
    # The engine sockets' in the background: podman's API service may take
    # seconds to start, and is not in the way of READY.
    recoveries = await features.recover(agents.features)
    maintenance = asyncio.get_running_loop().create_task(agents.maintain())
    figures = MetricsFile(agents.metric_families, lambda: (
        agents.machine_config.metrics.file, agents.machine_config.metrics.interval))

    if not await own_name(bus):
        log.error("could not own %s: is another leviathd running?", BUS_NAME)
        return 1
    running = sum(1 for r in agents.records.values() if r.running)
    if agents.config_problem:
        notify.ready(f"NOT STARTING AGENTS: {agents.config_problem}"[:400])
    else:
        notify.ready(f"serving; {running} agents running")
    journal.record(f"leviathd ready, {running} agents adopted", LEVIATH_EVENT=Event.READY)
    metrics_writer = asyncio.get_running_loop().create_task(figures.run())

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_hup() -> None:
        notify.reloading()
        with contextlib.suppress(LeviathError):  # said in the journal
            reloads.reload(Cause.SIGNAL)
        if agents.config_problem:
            notify.ready(f"NOT STARTING AGENTS: {agents.config_problem}"[:400])
        else:
            notify.ready("serving")

    loop.add_signal_handler(signal.SIGHUP, on_hup)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    disconnected = loop.create_task(bus.wait_for_disconnect())  # type: ignore[no-untyped-call]
    stopping = loop.create_task(stop.wait())
    await asyncio.wait({disconnected, stopping}, return_when=asyncio.FIRST_COMPLETED)
    lost = not stopping.done()
    if lost:
        # The name is gone with the connection and every caller's replies with
        # it; agents live on in their scopes. Not a clean exit: the next daemon
        # (Restart=) connects to the bus as it is now and adopts them.
        reason = disconnected.exception() if not disconnected.cancelled() else None
        log.error("lost the system bus connection (%s); exiting for a restart", reason)
        journal.record(
            f"leviathd lost its system bus connection ({reason}); exiting so that systemd "
            "restarts it", priority=syslog.LOG_ERR, LEVIATH_EVENT=Event.BUS_LOST,
        )
    notify.stopping()
    maintenance.cancel()
    metrics_writer.cancel()
    watcher.close()
    rules_watcher.close()
    for recovery in recoveries:
        recovery.cancel()
    # Each one closed, whichever failed before it (failures are logged).
    await features.close(agents.features)
    bus.disconnect()
    return EXIT_BUS_LOST if lost else 0


class _JournalPriority(logging.Formatter):
    """Prefix each line with its syslog level (sd-daemon(3)), so that journald
    files errors at error priority: `journalctl -u leviathd -p err` shows them."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.ERROR:
            level = syslog.LOG_ERR
        elif record.levelno >= logging.WARNING:
            level = syslog.LOG_WARNING
        elif record.levelno >= logging.INFO:
            level = syslog.LOG_INFO
        else:
            level = syslog.LOG_DEBUG
        text = super().format(record)
        return "\n".join(f"<{level}>{line}" for line in text.splitlines() or [""])


def check_config() -> int:
    """`leviathd --check-config` (ExecReload= runs it before SIGHUP): a broken
    file fails `systemctl reload` visibly instead of being ignored."""
    path = machine_config_path()
    try:
        config_load.load_machine(path)
    except ConfigError as exc:
        print(f"leviathd: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def _arguments(argv: list[str]) -> argparse.Namespace:
    """--help and --version print and exit; --check-config checks the machine
    config and exits; the daemon takes no other arguments (its settings are
    the environment and /etc/leviath)."""
    from leviathd import __version__

    parser = argparse.ArgumentParser(
        prog="leviathd",
        description="The leviathd system service: runs AI agents fenced, one systemd scope "
        "each, for local users who ask over D-Bus (org.leviath.Manager1). Started by "
        "systemd (leviathd.service) as root; users drive it with `lev`.",
        epilog="Environment: LEVIATH_CONFIG (default /etc/leviath/config.toml), "
        "LEVIATH_STATE_DIR (default /var/lib/leviath). See docs/ and `man lev`.",
    )
    parser.add_argument("--version", action="version", version=f"leviathd {__version__}")
    parser.add_argument("--check-config", action="store_true",
                        help="check the machine config (exit 78 with the file and line if it "
                        "does not load) and exit; `systemctl reload` runs it first")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(sys.argv[1:] if argv is None else argv)
    if args.check_config:
        return check_config()
    if os.geteuid() != 0:
        print("leviathd: must run as root (it starts agents as their users); it is "
              "started by systemd: `systemctl start leviathd`", file=sys.stderr)
        return 1
    fmt = "%(levelname)s %(name)s: %(message)s"
    if os.environ.get("JOURNAL_STREAM"):
        handler = logging.StreamHandler()
        handler.setFormatter(_JournalPriority(fmt))
        logging.basicConfig(level=logging.INFO, handlers=[handler])
    else:
        logging.basicConfig(level=logging.INFO, format=fmt)
    heap.return_large_buffers()
    try:
        return asyncio.run(serve())
    except LeviathError as exc:
        log.error("%s", exc)
        return 1
    except Exception:
        log.exception("leviathd failed")
        return 1


if __name__ == "__main__":
    sys.exit(main())
