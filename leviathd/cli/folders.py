"""`lev folder add|remove|list` ([[folders]] in the user config: a folder for one
agent, or for every agent in one repository) and `lev restart ID` (stop an
agent and start it again with the same workdir, mode and command, so that a
folder added meanwhile takes effect)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from leviathd.errors import InvalidArgument, NotFound

# How long `lev restart` waits for the stopped agent to end (its scope's own
# stop timeout is what bounds it; this only ends a wait that cannot succeed).
RESTART_WAIT = 120.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("folder", help="give a folder to one agent or to agents in a repository",
                       description="Folders in your config ([[folders]]): shown to one "
                       "installed agent, to every agent whose workdir is in a repository, "
                       "or to that agent in that repository.")
    verbs = p.add_subparsers(dest="verb", required=True)
    add = verbs.add_parser("add", help="add a folder to your config")
    add.add_argument("path", help="the folder (absolute or ~/...)")
    add.add_argument("--agent", help="for this installed agent (its blueprint name)")
    add.add_argument("--repository", "-r", metavar="DIR",
                     help="for agents whose workdir is this folder or inside it")
    add.add_argument("--write", action="store_true", help="writable (default: read-only)")
    add.set_defaults(func=add_main)
    rm = verbs.add_parser("remove", help="remove a folder from your config")
    rm.add_argument("path", help="the folder, as added (absolute or ~/...)")
    rm.add_argument("--agent", help="only its entry for this agent")
    rm.add_argument("--repository", "-r", metavar="DIR",
                    help="only its entry for agents in this repository")
    rm.set_defaults(func=remove_main)
    ls = verbs.add_parser("list", help="list the folders of your and the machine's config")
    ls.set_defaults(func=list_main)

    r = sub.add_parser("restart", help="stop an agent and start it again, same workdir and command")
    r.add_argument("id", help="the agent's id (lev ps)")
    r.set_defaults(func=restart_main)


def _home_form(path: str) -> str:
    """An argument as the config writes it: ~/... inside the home, else absolute."""
    home = os.path.expanduser("~")
    full = os.path.abspath(os.path.expanduser(path))
    if full == home:
        return "~"
    if full.startswith(home.rstrip("/") + "/"):
        return "~/" + full[len(home.rstrip("/")) + 1:]
    return full


def _refusal(path: str) -> str | None:
    """Why the daemon would refuse this folder (hidden, after links), or None."""
    from leviathd.config.load import load_configs
    from leviathd.identity import user_info
    from leviathd.sandbox.spec import expand, hidden_paths, is_within

    machine, user = load_configs()
    me = user_info(os.getuid())
    extra = [*machine.security.hidden_paths, *(user.security.hidden_paths if user else [])]
    full = expand(path, me.home)
    real = os.path.realpath(full)
    if is_within(me.home, full) or is_within(me.home, real):
        return "it would show the whole home folder"
    for h in hidden_paths(me, extra):
        if is_within(full, h) or is_within(real, h) or is_within(real, os.path.realpath(h)):
            return f"it is, or leads to, a place inside the hidden path {h}"
    return None


def add_main(args: argparse.Namespace) -> int:
    from leviathd.config.edit import atomic_write
    from leviathd.config.load import parse_config, user_config_path
    from leviathd.safetext import check_name

    if args.agent is None and args.repository is None:
        raise InvalidArgument("name the agent (--agent) or the repository (--repository) the "
                              "folder is for; [sandbox] mounts give a folder to every agent")
    if args.agent is not None:
        check_name(args.agent)
    path = _home_form(args.path)
    why = _refusal(path)
    if why is not None:
        raise InvalidArgument(f"folder {path} is refused: {why}")
    repository = _home_form(args.repository) if args.repository is not None else None
    config = user_config_path()
    try:
        text = config.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    if text and not text.endswith("\n"):
        text += "\n"
    import json

    block = f"\n[[folders]]\npath = {json.dumps(path)}\n"
    block += f'access = "{"write" if args.write else "read"}"\n'
    if args.agent is not None:
        block += f"agent = {json.dumps(args.agent)}\n"
    if repository is not None:
        block += f"repository = {json.dumps(repository)}\n"
    new = text + block
    parse_config(new, str(config))  # refused with the file and line if it does not load
    config.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write(config, new)
    access = "read-write" if args.write else "read-only"
    who = " in ".join(x for x in (f"agent {args.agent}" if args.agent else "every agent",
                                  repository or "") if x)
    print(f"{path} ({access}) for {who}: added to {config}")
    for agent_id, name in _running_concerned(args.agent, repository):
        print(f"agent {name} ({agent_id}) is running: the folder takes effect at its next "
              f"start (lev restart {agent_id})")
    return 0


def remove_main(args: argparse.Namespace) -> int:
    from leviathd.config.edit import atomic_write, remove_folders
    from leviathd.config.load import load_configs, user_config_path

    path = _home_form(args.path)
    repository = _home_form(args.repository) if args.repository is not None else None
    config = user_config_path()
    try:
        new, gone = remove_folders(config, path, args.agent, repository)
    except FileNotFoundError:
        new, gone = "", []
    if not gone:
        machine, _user = load_configs()
        if any(f.path == path for f in machine.folders):
            raise InvalidArgument(f"{path} is a folder of the machine's config "
                                  "(/etc/leviath/config.toml): only its admin removes it")
        raise NotFound(f"no folder {path} in {config} (lev folder list)")
    atomic_write(config, new)
    for grant in gone:
        access = "read-write" if str(grant.access) == "write" else "read-only"
        who = " in ".join(x for x in (f"agent {grant.agent}" if grant.agent else "every agent",
                                      grant.repository or "") if x)
        print(f"{grant.path} ({access}) for {who}: removed from {config}")
        for agent_id, name in _running_concerned(grant.agent, grant.repository):
            print(f"agent {name} ({agent_id}) is running: it keeps the folder until its next "
                  f"start (lev restart {agent_id})")
    return 0


def _agents(include_ended: bool) -> list[dict[str, Any]]:
    from leviathd.cli.control import MAX_PAGES, plain
    from leviathd.cli.wire import SyncClient, Variant

    client = SyncClient()
    rows: list[Any] = []
    try:
        cursor = ""
        for _ in range(MAX_PAGES):
            options = {"all": Variant("b", include_ended), "cursor": Variant("s", cursor)}
            page, cursor = client.call("ListPage", "a{sv}", [options])
            rows += page
            if not cursor:
                break
    finally:
        client.close()
    return [plain(r) for r in rows]


def _running_concerned(agent: str | None, repository: str | None) -> list[tuple[str, str]]:
    from leviathd.sandbox.spec import expand, is_within

    home = os.path.expanduser("~")
    repo = expand(repository, home) if repository is not None else None
    out: list[tuple[str, str]] = []
    try:
        rows = _agents(False)
    except Exception:  # no daemon: nothing runs that the edit could concern
        return []
    for a in rows:
        if a.get("uid") != os.getuid() or a.get("state") != "running":
            continue
        if agent is not None and a.get("agent") != agent:
            continue
        workdir = str(a.get("workdir", ""))
        if repo is not None and not (is_within(workdir, repo)
                                     or is_within(workdir, os.path.realpath(repo))):
            continue
        out.append((str(a.get("id")), str(a.get("agent"))))
    return out


def list_main(args: argparse.Namespace) -> int:
    from leviathd.config.load import load_configs

    machine, user = load_configs()
    rows = [("machine", f) for f in machine.folders]
    rows += [("user", f) for f in (user.folders if user else [])]
    if not rows:
        print("No folders. Add one with: lev folder add PATH --agent NAME | --repository DIR")
        return 0
    for layer, f in rows:
        who = " in ".join(x for x in (f"agent {f.agent}" if f.agent else "every agent",
                                      f.repository or "") if x)
        access = "read-write" if str(f.access) == "write" else "read-only"
        print(f"{f.path}  {access}  for {who}  ({layer} config)")
    return 0


def restart_main(args: argparse.Namespace) -> int:
    from leviathd.cli.inspect import from_daemon, is_agent_id
    from leviathd.cli.wire import SyncClient

    if not is_agent_id(args.id):
        raise InvalidArgument(f"{args.id!r} is not an agent id (lev ps)")
    rec = next((a for a in _agents(True) if a.get("id") == args.id), None)
    if rec is None:
        raise NotFound(f"no agent {args.id}")
    steps = from_daemon(args.id)
    if not steps:
        raise NotFound(f"agent {args.id} has no recorded sandbox")
    spec = steps[0][1]
    argv = [str(a) for a in rec.get("command", [])]
    name = str(rec.get("agent", ""))
    installed = _installed_blueprint(name)
    client = SyncClient()
    try:
        if rec.get("state") == "running":
            client.call("Stop", "s", [args.id])
        deadline = time.monotonic() + RESTART_WAIT
        while True:
            (info,) = client.call("Get", "s", [args.id])
            state = info["state"].value if "state" in info else ""
            if state not in ("running", "unknown"):
                break
            if time.monotonic() > deadline:
                raise InvalidArgument(f"agent {args.id} did not end within {RESTART_WAIT:.0f} s")
            time.sleep(0.2)
    finally:
        client.close()
    run = ["run", "--detach", "--workdir", spec.workdir, "--workdir-mode", spec.workdir_mode]
    source = str(rec.get("blueprint", ""))
    if source and os.path.isfile(source):
        run.append(source)
    elif installed is not None and (len(steps) > 1 or list(installed) == argv):
        run.append(name)
    else:
        run += ["--", *argv]
    print(f"agent {args.id} ended; starting it again: lev {' '.join(run)}", file=sys.stderr)
    from leviathd.cli.main import main

    return main(run)


def _installed_blueprint(name: str) -> list[str] | None:
    """The command of the installed agent `name`, or None when there is none."""
    from leviathd.config.agent_store import list_installed

    for agent in list_installed():
        if agent.name == name and agent.blueprint is not None:
            return list(agent.blueprint.agent.command or [])
    return None

