"""`lev inspect BLUEPRINT [--workdir DIR] [--json]`: what an agent would see.

Computed locally, from the same files and the same pure `build_spec` the
daemon uses, so an admin or a user can read the mount table, the hidden paths
and the environment before anything runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from leviathd.cli.run import blueprint_file
from leviathd.config.load import load_blueprint, load_configs
from leviathd.config.merge import resolve
from leviathd.domain.sandbox import SandboxKind
from leviathd.errors import InvalidArgument, NotFound
from leviathd.identity import user_info
from leviathd.sandbox.spec import RunRequest, SandboxSpec, build_spec_on_host

_PLACEHOLDER_ID = "EXECUTION"
# Issue 10 §4: what network = true means, until a proxied mode exists.
SHARED_NETWORK = "shares the host network: loopback services and abstract sockets reachable"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("inspect", help="show the sandbox an agent would get")
    p.add_argument(
        "blueprint",
        help="a blueprint folder or file, an installed agent's name, or a started agent's id",
    )
    p.add_argument("--workdir", "-w", help="the workdir to assume (default: here)")
    p.add_argument("--workdir-mode", choices=("rw", "ro", "throwaway"), default="rw",
                   help="the workdir mode to assume, as for lev run (default rw)")
    p.add_argument("--stage", help="show this stage's sandbox instead of the agent's")
    p.add_argument("--json", action="store_true", help="print the spec as JSON")
    p.set_defaults(func=main)


def is_agent_id(arg: str) -> bool:
    """By syntax only: ids are public, and a folder named like one, planted
    where an admin looks, must not stand in for the agent (`./ID` for it)."""
    return bool(re.fullmatch(r"[0-9a-f]{8}", arg))


def from_daemon(agent_id: str) -> list[tuple[str, SandboxSpec]]:
    """The specs the daemon recorded for a started agent."""
    import asyncio

    from leviathd.cli.client import Client

    async def fetch() -> str:
        client = await Client.connect()
        try:
            (text,) = await client.call("Inspect", "s", [agent_id])
        finally:
            client.close()
        return str(text)

    steps = json.loads(asyncio.run(fetch()))
    return [(str(s["label"]), SandboxSpec.from_dict(s["spec"])) for s in steps]


def hook_changes(agent_id: str) -> list[str]:
    """What the agent changed in the hook files it was given: its record's
    `hook_changes` (issue 48; set at its end)."""
    from leviathd.cli.wire import DaemonError, SyncClient

    client = SyncClient()
    try:
        (info,) = client.call("Get", "s", [agent_id])
    except (DaemonError, OSError):
        return []  # (the specs are shown; the listing is a note)
    finally:
        client.close()
    return [str(c) for c in info["hook_changes"].value] if "hook_changes" in info else []


def compute(args: argparse.Namespace) -> SandboxSpec:
    blueprint = load_blueprint(blueprint_file(args.blueprint))
    machine, user_config = load_configs()
    merged = resolve(machine, user_config, blueprint, blueprint.agent.name)
    for finding in merged.findings:
        print(f"{finding.level}: {finding.message}", file=sys.stderr)
    effective = merged.agent
    if args.stage:
        if args.stage not in merged.stages:
            raise NotFound(f"the blueprint has no stage {args.stage!r}")
        effective = merged.stages[args.stage]
    command = tuple(effective.command or blueprint.agent.command or ())
    if not command:
        raise InvalidArgument("the blueprint names no command")
    request = RunRequest(
        argv=command,
        workdir=os.path.abspath(args.workdir or os.getcwd()),
        workdir_mode=args.workdir_mode,
        env=dict(os.environ),
    )
    spec = build_spec_on_host(effective, user_info(os.getuid()), request, _PLACEHOLDER_ID)
    return with_tool_state_notes(spec, [list(command), *merged.seed,
                                        *(s.command for s in merged.stages.values())])


def with_tool_state_notes(spec: SandboxSpec, argvs: list[list[str]]) -> SandboxSpec:
    """What the daemon would make of the agent tools' state before the fence
    (sandbox/toolstate.py), as notes: made at the start, not by inspect."""
    import dataclasses

    from leviathd.sandbox import toolstate

    if spec.kind == SandboxKind.NONE:
        return spec

    def list_dir(path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))[: toolstate.MAX_NVM_VERSIONS]
        except OSError:
            return []

    from leviathd.sandbox.spec import is_within

    missing = toolstate.missing_state(
        spec.home, argvs, os.path.lexists, list_dir,
        hidden=lambda p: any(is_within(p, h) for h in spec.hidden))
    notes = tuple(
        f"~/{m.rel}: missing; made as you ({'folder 0700' if m.folder else 'file 0600'}) when "
        f"the agent starts, so that {m.tool} ({m.why}) keeps its state on the host"
        for m in missing
    )
    return dataclasses.replace(spec, notes=spec.notes + notes) if notes else spec


def _access(readonly: bool) -> str:
    return "read-only" if readonly else "read-write"


def _bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def _scratch_fs(spec: SandboxSpec) -> str:
    """What holds home, /tmp and the throwaway layers (sandbox/loopfs.py)."""
    size = _bytes(spec.scratch_size)
    if spec.scratch_fs == "ext4":
        return f"on disk, its own ext4 of {size} (not charged to memory_max)"
    return (f"in memory, a tmpfs of {size} charged to memory_max (this host has no loop "
            "devices or no mkfs.ext4)")


def acting_for_it(spec: SandboxSpec) -> list[str]:
    """Who else acts for the agent, and in which view (issue 43): one
    short line each."""
    if spec.kind == SandboxKind.NAMESPACE:
        files = "in this view: the broker's worker enters the fence's mounts"
    elif spec.kind == SandboxKind.CONTAINER:
        files = "the host's view as you, within the grants (not the container's mounts yet)"
    else:
        files = "the host's view as you, within the grants (no fence)"
    lines = [
        f"  {'file tools':<23} {files}",
        f"  {'shell, blueprint tools':<23} "
        + ("in this fence" if spec.kind == SandboxKind.NAMESPACE else "not in this sandbox kind"
           if spec.kind == SandboxKind.CONTAINER else "as you, no fence"),
        f"  {'credentials':<23} read outside the fence, as you (files it cannot see)",
    ]
    if "DOCKER_HOST" in spec.env:
        if any(n.startswith("container engine: ROOT ON THE HOST") for n in spec.notes):
            # host_root_engine: the daemon's podman, in the machine's view
            engine = "ROOT ON THE HOST, in the machine's view (host_root_engine)"
        else:
            engine = "as you, in this agent's scope and in this view"
        lines.append(f"  {'container engine':<23} {engine} (docs/containers.md: what it sees)")
    lines.append(f"  {'approvals, stop, policy':<23} only from outside every agent")
    return lines


def render(spec: SandboxSpec) -> str:
    lines = [
        f"sandbox     {spec.kind}",
        f"command     {' '.join(spec.argv)}",
        f"user        {spec.user} (uid {spec.uid}, gid {spec.gid}, "
        f"groups {','.join(map(str, spec.groups))})",
        f"workdir     {spec.workdir} ({spec.workdir_mode})",
        f"home        {spec.sandbox_home} (empty, in scratch)",
        f"scratch     {spec.scratch}  ({_PLACEHOLDER_ID} = the run's id): {_scratch_fs(spec)}",
        f"namespaces  {', '.join(spec.namespaces) or '(none)'}",
        "network     " + (SHARED_NETWORK if spec.network else
                             "proxy (only lo; out through the daemon's proxy at 127.0.0.1:3128)"
                             if spec.proxy else "none (only lo)"),
        f"hostname    {spec.hostname}",
    ]
    limits = {k: v for k, v in spec.limits.items() if v is not None}
    if limits:
        lines.append("limits      " + ", ".join(f"{k}={v}" for k, v in limits.items()))
    lines += ["", "what it sees:"]
    for m in spec.mounts:
        if m.kind == "bind":
            src = "" if m.source == m.target else f"  <- {m.source}"
            lines.append(f"  {m.target:<40} {_access(m.readonly):<10} {m.why}{src}")
        elif m.kind == "overlay":
            lines.append(f"  {m.target:<40} {'throwaway':<10} {m.why}, layer in {m.upper}")
        elif m.kind == "symlink":
            lines.append(f"  {m.target:<40} {'link':<10} -> {m.source}")
        elif m.kind == "mask":
            lines.append(f"  {m.target:<40} {'hidden':<10} covered inside a mounted folder")
        elif m.kind != "protect":
            lines.append(f"  {m.target:<40} {m.kind:<10} {m.why}")
    protect = [m for m in spec.mounts if m.kind == "protect"]
    if protect:
        lines += ["", "protected (git or an agent tool would run them later, on the host):"]
        for m in protect:
            how = "read-only" if m.readonly else "pinned"
            what = m.target + ("/" if m.source == "dir" else "")
            lines.append(f"  {what:<40} {how:<10} {m.why}")
    lines += ["", "never visible:"]
    lines += [f"  {h}" for h in spec.hidden]
    lines += ["", "acting for it:"]
    lines += acting_for_it(spec)
    lines += ["", "environment:"]
    lines += [f"  {k}={v}" for k, v in sorted(spec.env.items())]
    if spec.notes:
        lines += ["", "notes:"]
        lines += [f"  {n}" for n in spec.notes]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    if is_agent_id(args.blueprint):
        steps = from_daemon(args.blueprint)
        if args.json:
            print(json.dumps([{"label": lb, "spec": sp.to_dict()} for lb, sp in steps], indent=2))
        else:
            print("\n\n".join(f"== {lb} ==\n{render(sp)}" for lb, sp in steps))
            changed = hook_changes(args.blueprint)
            if changed:
                print("\nhook files it changed (they run on the host): " + ", ".join(changed))
        return 0
    spec = compute(args)
    if args.json:
        print(json.dumps(spec.to_dict(), indent=2, sort_keys=True))
    else:
        print(render(spec))
    return 0
