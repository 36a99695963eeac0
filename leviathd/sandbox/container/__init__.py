"""The container kind: a warm container per sandbox configuration of an agent,
commands run in it with `exec`, everything torn down when the agent ends.

Daemon side (asyncio, root):
  ensure(agent_id, unit, spec, effective) -> name
      starts (or finds) the agent's container for these settings: its
      processes sit in a cgroup below the agent's scope, so systemd counts them
      (MEM, TASKS, limits) and stops them with the scope;
  teardown(agent_id), sweep(live_ids)
      remove the containers of one agent, or of every agent not alive.
Worker side (the supervisor's worker, root, in the scope, stdio connected):
  run(spec) execs `podman exec` (or docker) for spec.argv in the container
  named by `with_container(spec, name)`, so the agent's stdio and exit status
  flow through the engine.

Why a cgroup below the scope works on a hybrid host (docs/containers.md): with
podman's cgroupfs manager and `--cgroup-parent` set to the scope's own cgroup,
runc makes `<scope>/libpod-<id>` in every hierarchy and applies the container's
own pids/memory limits there; the scope's limits hold over the whole subtree.
conmon, which podman forks, would stay in the daemon's cgroup (killed with the
daemon on restart, invisible to the agent's unit): the engine command therefore
runs from a shell that first joins the scope's cgroups, so conmon is born
inside the scope.

Labels on every container (LABEL_*): the agent, its user and the daemon
instance (machine id and state folder), so a daemon only ever lists and removes
its own containers and finds them again after a restart.
"""

from leviathd.sandbox.container.availability import probe
from leviathd.sandbox.container.cgroups import cgroup_procs_files
from leviathd.sandbox.container.cleanup import end_hook, sweep, teardown
from leviathd.sandbox.container.settings import daemon_instance
from leviathd.sandbox.container.start import ensure, with_container
from leviathd.sandbox.container.worker import run

# The kind's face: what the daemon (agents/, gate/, enginesock/) and the
# supervisor's worker call. Its parts, one module each, along the old file's
# sections: settings (pure), availability, cgroups, records, start, worker,
# cleanup.
__all__ = ["cgroup_procs_files", "daemon_instance", "end_hook", "ensure", "probe", "run",
           "sweep", "teardown", "with_container"]
