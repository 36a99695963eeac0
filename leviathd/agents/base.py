"""The state every part of `Agents` shares (agents/service.py): the
records of running agents, the machine's and users' configuration, the
per-agent features, and records kept in memory while the state filesystem
is full."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import syslog
from collections.abc import Callable, Iterator, Sequence

from leviathd import metrics, safetext
from leviathd.agents import output
from leviathd.agents.feature import AgentFeature
from leviathd.agents.usage import UsageCache
from leviathd.audit.readers import CallerWatch, Readers
from leviathd.authority import Authority
from leviathd.config import load as config_load
from leviathd.config.merge import DEFAULT_ENGINE
from leviathd.config.models import Config
from leviathd.errors import ConfigError, NoSpace
from leviathd.events import Event
from leviathd.identity import UserInfo
from leviathd.records import AgentRecord, RecordStore
from leviathd.sandbox import hookwatch, scratchpool
from leviathd.sandbox.container import pins as image_pins
from leviathd.systemd import journal
from leviathd.systemd.manager import SystemdManager
from leviathd.userfiles import read_user_file

SLICE = "leviath.slice"
unit_name = safetext.unit_name
log = logging.getLogger(__name__)


Emit = Callable[..., None]
_UNPROBED = object()
NAMESPACE_STAND_IN = "LEVIATH_NAMESPACE_UNAVAILABLE"

# Run requests of one uid being prepared or waiting to be (issue 22); also
# the starts of one uid holding a fork and a scope before polkit answered.
MAX_WAITING_PER_UID = 4

# How long preparation waits for polkit before an engine probe (the bus
# answers NoReply after 25 s).
AUTH_PATIENCE = 60.0
PLANNING_WORKERS = 4

# Connections told of one agent's end: its starter and those that asked
# since (Watch; a client that outlived a daemon restart). The newest are kept.
MAX_LISTENERS = 8


@contextlib.contextmanager
def _logged(what: str) -> Iterator[None]:
    """Best-effort cleanup: whatever fails is logged with its traceback and
    the daemon goes on (it never ends over one agent's leftovers)."""
    try:
        yield
    except Exception:
        log.warning("%s failed", what, exc_info=True)


class AgentsBase:
    """What the start, the end and the queries of agents share."""

    def __init__(
        self,
        callers: CallerWatch,
        systemd: SystemdManager,
        store: RecordStore,
        *,
        authority: Authority,
        machine_config_path: str,
        scratch_dir_default: str,
        on_started: Emit,
        on_ended: Emit,
    ) -> None:
        self._authority = authority
        self._systemd = systemd
        self._store = store
        self._machine_path = machine_config_path
        self._scratch_default = scratch_dir_default
        # Each running namespace agent's scratch file, a copy kept by us
        # (sandbox/loopfs.py): closed once the agent has ended.
        self._images: dict[str, int] = {}
        # (uid, scratch_size) of each agent whose scratch is made or being
        # made: what each user's agents may take of scratch_dir's disk.
        self._scratch_sizes: dict[str, tuple[int, int]] = {}
        # New scratch filesystems made ahead, each handed to one agent.
        self._scratch_pool = scratchpool.ScratchPool()
        self._on_started = on_started
        self._on_ended = on_ended
        self.machine_config = Config()
        self.records: dict[str, AgentRecord] = {}
        self._watches: dict[str, int] = {}
        # Agents whose pidfd the last recheck found ended (ending._unheard_ends).
        self._seen_ended: set[str] = set()
        # Attached agents whose output the daemon copies (agents/output.py).
        self._copies: dict[str, output.OutputCopy] = {}
        # The hook files given to each agent, as they were at its start
        # (sandbox/hookwatch.py): compared at its end. Memory only.
        self._hooks_before: dict[str, hookwatch.Snapshot] = {}
        # List's memory and tasks figures, from memory (issue 18).
        self.usage = UsageCache(self._live_by_unit)
        self.readers = Readers(callers)
        self._finalizing: set[str] = set()
        # Records the state filesystem had no room for (a full disk): held
        # here, served from here, and written by maintain() once it has room.
        self.unsaved: dict[str, AgentRecord] = {}
        self._user_configs: dict[int, Config] = {}
        self._namespace_probe: object = _UNPROBED
        self._plan_pool = concurrent.futures.ThreadPoolExecutor(
            PLANNING_WORKERS, thread_name_prefix="leviath-plan"
        )
        self._plan_locks: dict[int, asyncio.Lock] = {}
        self._plan_waiting: dict[int, int] = {}
        # Per uid: starts holding a fork and a scope before polkit answered.
        self._unanswered: dict[int, int] = {}
        # Per uid: starts under way, from the request to its answer.
        self._starting: dict[int, int] = {}
        # Uids polkit last said yes to (to RUN, since the daemon started):
        # only their starts fork and start a scope before the answer.
        self._granted: set[int] = set()
        # Who hears an agent's AgentStarted/AgentEnded: the bus connection that
        # started it, and those that asked with Watch (not kept over a restart:
        # clients then ask again).
        self._signal_to: dict[str, list[str]] = {}
        # Set by the daemon where systemd is not PID 1: podman alone fences.
        self.podman_only = False
        # Set by the daemon when the machine config did not load at start:
        # then no agent starts (cleared by the first good load).
        self.config_problem: str | None = None
        # The per-agent features (agents/feature.py), in the order they are
        # called; given once by use().
        self.features: tuple[AgentFeature, ...] = ()
        self._holds: set[asyncio.Future[None]] = set()

    def use(self, features: Sequence[AgentFeature]) -> None:
        """The per-agent features, once, before the daemon serves: they are
        made with this Agents (they read its records and configuration), so
        they cannot be given to its constructor."""
        if self.features:
            raise RuntimeError("the agent features are given once")
        self.features = tuple(features)

    # --- configuration -----------------------------------------------------

    def load_machine_config(self) -> None:
        """Raises ConfigError and keeps the old config when the file is bad."""
        self._namespace_probe = _UNPROBED
        # With /etc/leviath/rules.d (root's files only), checked as one: a
        # bad file there keeps the old configuration like a bad config.toml.
        self.machine_config = config_load.load_machine(self._machine_path)
        self.config_problem = None
        # The container kind runs the ID the machine's image has now, not
        # whatever its tag names later (sandbox/container/pins.py).
        ms = self.machine_config.sandbox
        image_pins.reload({(str(ms.engine or DEFAULT_ENGINE), ms.image)}
                          if ms is not None and ms.image else set())

    def metric_families(self) -> list[metrics.Family]:
        """The figures as they are now (metrics.py), gathered on the loop:
        the counters' copy and the running agents by user and kind."""
        return [*metrics.REGISTRY.snapshot(), metrics.running_family(
            (rec.user, rec.sandbox) for rec in self.records.values() if rec.running)]

    def _running_of(self, uid: int) -> int:
        """The uid's running agents (ended ones leave `records`)."""
        return sum(1 for rec in self.records.values() if rec.uid == uid)

    def _agent_cap(self) -> int | None:
        """The machine's cap on one user's running agents ([limits])."""
        return self.machine_config.limits.agents_per_user

    def user_config(self, user: UserInfo) -> Config | None:
        path = os.path.join(user.home, ".config", "leviath", "config.toml")
        try:
            text = read_user_file(path, user.uid, user.gid, limit=config_load.MAX_TEXT_BYTES)
        except PermissionError as exc:
            raise ConfigError(str(exc)) from None
        if text is None:
            self._user_configs.pop(user.uid, None)
            return None
        try:
            config = config_load.parse_config(text, path)
        except ConfigError as exc:
            last_good = self._user_configs.get(user.uid)
            if last_good is None:
                raise
            # As with the machine file: a broken edit leaves the last good
            # configuration in force, and says so where the admin looks.
            journal.record(
                f"{path} does not load; the last good version stays in force: {exc}",
                priority=syslog.LOG_ERR, LEVIATH_EVENT=Event.RELOAD_FAILED, LEVIATH_USER=user.name,
            )
            return last_good
        self._user_configs[user.uid] = config
        return config

    def _save(self, rec: AgentRecord) -> bool:
        """Write a record; when the state filesystem is full, hold it in
        memory instead (served from there) until write_unsaved() can."""
        try:
            self._store.save(rec)
        except NoSpace as exc:
            if rec.id not in self.unsaved:
                journal.record(
                    f"agent {rec.id}: {exc}; its record ({rec.state.value}) is kept in memory "
                    "and written when space returns",
                    priority=syslog.LOG_ERR, LEVIATH_AGENT=rec.id,
                    LEVIATH_EVENT=Event.RECORD_UNSAVED,
                )
            self.unsaved[rec.id] = rec
            if not rec.active:
                self._store.index_ended(rec)
            return False
        self.unsaved.pop(rec.id, None)
        return True

    def write_unsaved(self) -> None:
        for rec in list(self.unsaved.values()):
            if not self._save(rec):
                return
            if not rec.active:
                self._store.drop_exit(rec.id)
            journal.record(
                f"agent {rec.id}: its record ({rec.state.value}) is written now",
                LEVIATH_AGENT=rec.id, LEVIATH_EVENT=Event.RECORD_SAVED,
            )

    async def _live_by_unit(self, _agent_id: str, unit: str) -> tuple[dict[str, int | None], str]:
        state = await self._systemd.unit_state(unit)
        if state is None:
            return {}, ""
        return {
            "memory": state.memory_current, "tasks": state.tasks_current,
            "memory_max": state.memory_max, "tasks_max": state.tasks_max,
        }, state.control_group  # fmt: skip
