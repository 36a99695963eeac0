"""The sandbox's front door: one entry per sandbox kind saying how it is
probed, what the held child is given for it, what the daemon sets up and
tears down for it once the scope exists, and how a command is run in it.

The daemon (agents/service.py, gate/service.py), the supervisor
(sandbox/supervisor.py) and the shell tool's process (gate/shell.py) ask this
table instead of comparing the kind, so a new sandbox kind is one `SandboxKind`
value (domain/sandbox.py) and one entry in `LAUNCHERS`.

The kinds' modules are imported inside the entries' functions, when the
entry is used: the forked supervisor and the shell tool's process load only
the launcher they run (and the container kind's daemon side only when a
container is started)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from leviathd.domain.sandbox import SandboxKind
from leviathd.sandbox.spec import SandboxSpec

if TYPE_CHECKING:
    from leviathd.sandbox.namespace import StepNamespaces
    from leviathd.systemd.manager import SystemdManager

Ready = Callable[[], None] | None


@dataclass(frozen=True)
class HeldNeeds:
    """What the held child (supervisor.fork_held) is given for steps of a kind."""

    # The daemon's sealed dash (namespace.shared_sealed): PID 1 of an agent
    # without a supervisor.
    shell: bool = False
    # The same, only when the agent is one step of this kind (the lean
    # hand-over, supervisor._lean).
    shell_if_one_step: bool = False
    # The daemon's sealed catatonit: PID 1 of a supervised fence.
    init: bool = False
    # An empty file for the agent's scratch file system (sandbox/loopfs.py).
    scratch_image: bool = False
    # A hold socket: the fence's PID 1 waits for the daemon to mark its
    # mounts before the command runs (sandbox/fencehold.py).
    fence_hold: bool = False


@dataclass(frozen=True)
class RunContext:
    """What the running process hands a launcher besides the spec."""

    # The workdir as the user opened it (the supervisor's WORKDIR_FD).
    workdir_fd: int | None = None
    # The fence's wait for the daemon (fencehold.waiter), when it asked for one.
    ready: Ready = None


class Ensure(Protocol):
    """The kind's per-agent resources, set up once the agent's scope exists
    (their cgroups sit below it); returns the spec its worker runs."""

    async def __call__(
        self, agent_id: str, unit: str, spec: SandboxSpec, effective: Any, *,
        units: SystemdManager, started: set[str], pinned_workdir: str | None,
    ) -> SandboxSpec: ...


class Start(Protocol):
    """Start the agent and leave (supervisor._hand_over): its PID 1's pid."""

    def __call__(
        self, spec: SandboxSpec, *, workdir_fd: int | None, exit_fd: int, shell: int,
        ready: Ready, kept: tuple[int, int] | None,
    ) -> int: ...


@dataclass(frozen=True)
class Launcher:
    kind: SandboxKind
    # -- the daemon's side
    # Why the kind cannot be built here for these settings (None: it can).
    probe: Callable[[Any], str | None]
    held: HeldNeeds
    # The mount table is the kind's own (what spec extensions bind into);
    # False: the agent sees the host's files.
    fenced: bool
    # The `shell` tool and blueprint tools may run in it (gate/service.py).
    tools: bool
    # -- the child's side: run the spec's command here, in a fence of its own.
    run: Callable[[SandboxSpec, RunContext], int]
    ensure: Ensure | None = None
    # Undoes `ensure` for an agent whose start failed.
    teardown: Callable[[str], Awaitable[object]] | None = None
    # A supervised step's namespaces, entered before its PID 1 is forked.
    enter_step: Callable[[SandboxSpec], StepNamespaces] | None = None
    # Start and leave, no supervisor (supervisor._lean); None: always supervised.
    start: Start | None = None
    # Run the spec's command in the agent's running fence, found from its
    # recorded anchor process in `unit` (sandbox/join.py); None: a fresh one.
    join: Callable[[SandboxSpec, int, str, Ready], int] | None = None


# -- namespace (sandbox/namespace/) ---------------------------------------------


def _namespace_probe(_effective: Any) -> str | None:
    from leviathd.sandbox import namespace

    return namespace.probe()


def _namespace_run(spec: SandboxSpec, ctx: RunContext) -> int:
    from leviathd.sandbox import namespace

    return namespace.run(spec, workdir_fd=ctx.workdir_fd, ready=ctx.ready)


def _namespace_enter_step(spec: SandboxSpec) -> StepNamespaces:
    from leviathd.sandbox import namespace

    return namespace.enter_step(spec)


def _namespace_start(
    spec: SandboxSpec, *, workdir_fd: int | None, exit_fd: int, shell: int, ready: Ready,
    kept: tuple[int, int] | None,
) -> int:
    from leviathd.sandbox import namespace

    return namespace.start(spec, workdir_fd=workdir_fd, exit_fd=exit_fd, shell=shell,
                           ready=ready, kept=kept)


def _namespace_join(spec: SandboxSpec, anchor: int, unit: str, ready: Ready) -> int:
    from leviathd.sandbox import join

    return join.run(spec, anchor=anchor, unit=unit, ready=ready)


# -- container (sandbox/container/) ---------------------------------------------


def _container_probe(effective: Any) -> str | None:
    from leviathd.sandbox import container

    return container.probe(effective)


async def _container_ensure(
    agent_id: str, unit: str, spec: SandboxSpec, effective: Any, *,
    units: SystemdManager, started: set[str], pinned_workdir: str | None,
) -> SandboxSpec:
    from leviathd.sandbox import container

    name = await container.ensure(agent_id, unit, spec, effective, units=units,
                                  started=started, pinned_workdir=pinned_workdir)
    return container.with_container(spec, name)


async def _container_teardown(agent_id: str) -> object:
    from leviathd.sandbox import container

    return await container.teardown(agent_id)


def _container_run(spec: SandboxSpec, _ctx: RunContext) -> int:
    from leviathd.sandbox import container

    return container.run(spec)


# -- none (sandbox/none.py) -----------------------------------------------------


def _none_probe(_effective: Any) -> str | None:
    return None


def _none_run(spec: SandboxSpec, _ctx: RunContext) -> int:
    from leviathd.sandbox import none

    return none.run(spec)


def _none_start(
    spec: SandboxSpec, *, workdir_fd: int | None, exit_fd: int, shell: int, ready: Ready,
    kept: tuple[int, int] | None,
) -> int:
    from leviathd.sandbox import none

    return none.start(spec, exit_fd=exit_fd, shell=shell, kept=kept)


LAUNCHERS: dict[SandboxKind, Launcher] = {
    SandboxKind.NAMESPACE: Launcher(
        SandboxKind.NAMESPACE, probe=_namespace_probe,
        held=HeldNeeds(shell=True, init=True, scratch_image=True, fence_hold=True),
        fenced=True, tools=True, run=_namespace_run, enter_step=_namespace_enter_step,
        start=_namespace_start, join=_namespace_join,
    ),
    SandboxKind.CONTAINER: Launcher(
        SandboxKind.CONTAINER, probe=_container_probe, held=HeldNeeds(),
        fenced=True, tools=False, run=_container_run,
        ensure=_container_ensure, teardown=_container_teardown,
    ),
    SandboxKind.NONE: Launcher(
        SandboxKind.NONE, probe=_none_probe, held=HeldNeeds(shell_if_one_step=True),
        fenced=False, tools=True, run=_none_run, start=_none_start,
    ),
}


def launcher(kind: str) -> Launcher:
    """The entry of `kind` (a recorded spec's, so also its plain spelling)."""
    return LAUNCHERS[SandboxKind(kind)]


def held_needs(kinds: Sequence[str]) -> HeldNeeds:
    """What the held child is given for an agent whose steps are of `kinds`."""
    entries = [launcher(k).held for k in kinds]
    one_step = len(entries) == 1 and entries[0].shell_if_one_step
    return HeldNeeds(
        shell=one_step or any(h.shell for h in entries),
        init=any(h.init for h in entries),
        scratch_image=any(h.scratch_image for h in entries),
        fence_hold=any(h.fence_hold for h in entries),
    )
