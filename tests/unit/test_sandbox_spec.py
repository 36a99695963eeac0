"""The sandbox spec: the Legato visibility table as a pure value. No root, no I/O:
every answer about the host is passed in."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Mapping

import pytest

from leviathd.config.merge import Effective
from leviathd.config.models import SandboxKind
from leviathd.domain.mounts import Access
from leviathd.domain.mounts import MountRequest as ConfigMount
from leviathd.errors import InvalidArgument
from leviathd.identity import UserInfo
from leviathd.sandbox.spec import (
    CACHES,
    HIDDEN_IN_HOME,
    TOOLCHAINS,
    Mount,
    RunRequest,
    SandboxSpec,
    build_spec,
    is_within,
)

HOME = "/home/alice"
ALICE = UserInfo("alice", 1000, 1000, (1000, 27), HOME, "/bin/bash")
WORKDIR = f"{HOME}/src/app"


def everything_exists(_path: str) -> bool:
    return True


def spec_for(
    effective: Effective | None = None,
    *,
    workdir: str = WORKDIR,
    mode: str = "rw",
    existing: Callable[[str], bool] = everything_exists,
    resolve: Callable[[str], str] | None = None,
    files: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    other_homes: tuple[str, ...] = ("/home/bob",),
) -> SandboxSpec:
    texts = dict(files or {})
    return build_spec(
        effective or Effective(kind=SandboxKind.NAMESPACE),
        ALICE,
        RunRequest(("claude",), workdir, mode, dict(env or {})),  # type: ignore[arg-type]
        "0123abcd",
        existing=existing,
        resolve=resolve,
        read_text=texts.get,
        links={"/bin": "usr/bin", "/lib": "usr/lib"},
        other_homes=other_homes,
    )


def binds(spec: SandboxSpec) -> dict[str, Mount]:
    return {m.target: m for m in spec.mounts if m.kind in ("bind", "overlay")}


def test_no_hidden_path_is_ever_a_mount_source_or_a_mounted_target() -> None:
    spec = spec_for()
    hidden = [posixpath.join(HOME, rel) for rel in HIDDEN_IN_HOME] + ["/home/bob", "/root"]
    for m in spec.mounts:
        if m.kind not in ("bind", "overlay") or m.exact:
            continue
        for h in hidden:
            assert not is_within(m.source, h), (m, h)
            assert not is_within(m.target, h), (m, h)
    assert set(hidden) <= set(spec.hidden)


def test_the_system_is_read_only_and_top_level_links_stay_links() -> None:
    spec = spec_for()
    table = binds(spec)
    for path in ("/usr", "/etc", "/opt"):
        assert table[path].readonly and table[path].source == path
    links = {m.target: m.source for m in spec.mounts if m.kind == "symlink"}
    assert links == {"/bin": "usr/bin", "/lib": "usr/lib"}
    # Host directories that are not links are bound read-only instead.
    assert table["/sbin"].readonly


def test_home_and_tmp_are_scratch_folders_on_disk_and_the_workdir_is_read_write() -> None:
    spec = spec_for()
    table = binds(spec)
    assert spec.scratch == "/var/lib/leviath/scratch/0123abcd"
    assert table[HOME].source == f"{spec.scratch}/home" and not table[HOME].readonly
    assert table["/tmp"].source == f"{spec.scratch}/tmp"
    assert table[WORKDIR].source == WORKDIR and not table[WORKDIR].readonly
    assert spec.sandbox_home == HOME
    kinds = [m.kind for m in spec.mounts if m.target in ("/proc", "/dev")]
    assert kinds == ["proc", "dev"]


def test_nothing_of_the_host_root_is_mounted_whole() -> None:
    spec = spec_for()
    assert all(m.target != "/" for m in spec.mounts)
    for absent in ("/home", "/var", "/run", "/srv", "/mnt", "/media", "/root", "/home/bob"):
        assert absent not in binds(spec)


def test_parents_are_mounted_before_what_lies_inside_them() -> None:
    spec = spec_for()
    seen: list[str] = []
    for m in spec.mounts:
        for earlier in seen:
            assert not (is_within(earlier, m.target) and earlier != m.target), (earlier, m)
        seen.append(m.target)


def test_claude_json_is_the_agents_copy_or_else_read_only() -> None:
    """Issue 45: the host's ~/.claude.json (MCP server commands) is never
    bound writable: the agent's copy is, when the start made one."""
    copy = f"{HOME}/.local/state/leviath/claude/0123abcd.json"
    mounted = binds(spec_for())[f"{HOME}/.claude.json"]
    assert mounted.source == copy and not mounted.readonly and mounted.exact
    no_copy = binds(spec_for(existing=lambda p: p != copy))[f"{HOME}/.claude.json"]
    assert no_copy.source == f"{HOME}/.claude.json" and no_copy.readonly


def test_agent_state_is_writable_toolchains_read_only_and_caches_writable() -> None:
    table = binds(spec_for())
    assert not table[f"{HOME}/.claude"].readonly
    assert not table[f"{HOME}/.codex"].readonly
    assert table[f"{HOME}/.local/bin"].readonly
    assert table[f"{HOME}/.cargo/bin"].readonly
    assert table[f"{HOME}/go/bin"].readonly
    for rel in (".cache/pip", ".npm", ".cargo/registry", "go/pkg/mod", ".m2/repository"):
        assert not table[f"{HOME}/{rel}"].readonly, rel
    known = table[f"{HOME}/.ssh/known_hosts"]
    assert known.readonly and known.exact


def test_only_entries_that_exist_are_mounted_in_the_home() -> None:
    present = {"/usr", "/etc", WORKDIR, f"{HOME}/.claude", f"{HOME}/.npm"}
    table = binds(spec_for(existing=present.__contains__))
    home_entries = {t for t in table if is_within(t, HOME) and t not in (HOME, WORKDIR)}
    assert home_entries == {f"{HOME}/.claude", f"{HOME}/.npm"}


def test_default_mounts_false_leaves_toolchains_and_caches_out() -> None:
    spec = spec_for(Effective(kind=SandboxKind.NAMESPACE, default_mounts=False))
    table = binds(spec)
    for rel in TOOLCHAINS + CACHES:
        assert f"{HOME}/{rel}" not in table, rel
    assert f"{HOME}/.claude" in table


def test_a_config_mount_is_bound_with_the_access_asked_for() -> None:
    eff = Effective(
        kind=SandboxKind.NAMESPACE,
        mounts=[
            ConfigMount(path="~/Documents/specs"),
            ConfigMount(path="/data/shared", access=Access.WRITE),
        ],
    )
    table = binds(spec_for(eff))
    assert table[f"{HOME}/Documents/specs"].readonly
    assert not table["/data/shared"].readonly


def test_a_config_mount_inside_a_hidden_path_is_refused() -> None:
    eff = Effective(kind=SandboxKind.NAMESPACE, mounts=[ConfigMount(path="~/.ssh/keys")])
    with pytest.raises(InvalidArgument, match=r"hidden path /home/alice/\.ssh"):
        spec_for(eff)


def test_a_config_mount_that_is_a_link_into_a_hidden_path_is_refused() -> None:
    eff = Effective(kind=SandboxKind.NAMESPACE, mounts=[ConfigMount(path="~/notes")])

    def resolve(path: str) -> str:
        return path.replace(f"{HOME}/notes", f"{HOME}/.aws")

    with pytest.raises(InvalidArgument, match=r"\.aws"):
        spec_for(eff, resolve=resolve)


def test_a_config_mount_under_a_linked_hidden_folder_is_refused_where_it_really_lives() -> None:
    # ~/.gnupg is a link to /secure/gnupg; mounting /secure/gnupg/x is still refused.
    eff = Effective(kind=SandboxKind.NAMESPACE, mounts=[ConfigMount(path="/secure/gnupg/x")])

    def resolve(path: str) -> str:
        return path.replace(f"{HOME}/.gnupg", "/secure/gnupg")

    with pytest.raises(InvalidArgument, match="gnupg"):
        spec_for(eff, resolve=resolve)


def test_extra_hidden_paths_from_config_are_refused_and_covered() -> None:
    eff = Effective(
        kind=SandboxKind.NAMESPACE,
        hidden_paths=["/data/shared/secrets", "~/private"],
        mounts=[ConfigMount(path="/data/shared")],
    )
    spec = spec_for(eff)
    assert "/data/shared/secrets" in spec.hidden and f"{HOME}/private" in spec.hidden
    masks = {m.target for m in spec.mounts if m.kind == "mask"}
    assert "/data/shared/secrets" in masks
    eff2 = Effective(
        kind=SandboxKind.NAMESPACE,
        hidden_paths=["~/private"],
        mounts=[ConfigMount(path="~/private/x")],
    )
    with pytest.raises(InvalidArgument):
        spec_for(eff2)


def test_leviaths_own_configuration_is_covered_inside_the_read_only_etc() -> None:
    masks = {m.target for m in spec_for().mounts if m.kind == "mask"}
    assert "/etc/leviath" in masks


def test_another_users_home_and_the_scratch_of_other_agents_are_hidden() -> None:
    spec = spec_for()
    assert "/home/bob" in spec.hidden
    assert "/var/lib/leviath/scratch" in spec.hidden
    with pytest.raises(InvalidArgument):
        spec_for(workdir="/home/bob/src")


def test_a_workdir_inside_a_hidden_path_or_holding_the_whole_home_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="hidden"):
        spec_for(workdir=f"{HOME}/.ssh")
    with pytest.raises(InvalidArgument, match="whole home"):
        spec_for(workdir=HOME)
    with pytest.raises(InvalidArgument, match="whole home"):
        spec_for(workdir="/home")


def test_known_hosts_that_links_to_a_private_key_is_not_mounted() -> None:
    def resolve(path: str) -> str:
        if path == f"{HOME}/.ssh/known_hosts":
            return f"{HOME}/.ssh/id_ed25519"
        return path

    spec = spec_for(resolve=resolve)
    assert f"{HOME}/.ssh/known_hosts" not in binds(spec)
    assert any("known_hosts" in n for n in spec.notes)


def _worktree_files() -> dict[str, str]:
    return {
        f"{WORKDIR}/.git": "gitdir: /repos/app/.git/worktrees/app\n",
        "/repos/app/.git/worktrees/app/commondir": "../..\n",
        "/repos/app/.git/worktrees/app/gitdir": f"{WORKDIR}/.git\n",
    }


def test_a_worktrees_main_git_folder_is_writable_too() -> None:
    table = binds(spec_for(files=_worktree_files()))
    assert table["/repos/app/.git"].source == "/repos/app/.git"
    assert not table["/repos/app/.git"].readonly
    # The worktree's own git folder lies inside the main one: not mounted twice.
    assert "/repos/app/.git/worktrees/app" not in table


def test_a_read_only_workdir_makes_the_worktree_git_folder_read_only() -> None:
    table = binds(spec_for(files=_worktree_files(), mode="ro"))
    assert table[WORKDIR].readonly and table["/repos/app/.git"].readonly


def test_a_throwaway_workdir_is_an_overlay_with_its_layers_in_scratch() -> None:
    spec = spec_for(files=_worktree_files(), mode="throwaway")
    table = binds(spec)
    for target in (WORKDIR, "/repos/app/.git"):
        m = table[target]
        assert m.kind == "overlay" and m.source == target
        assert is_within(m.upper, spec.scratch) and is_within(m.work, spec.scratch)
    assert table[WORKDIR].upper != table["/repos/app/.git"].upper


def _git_binds(spec: SandboxSpec) -> list[str]:
    return [m.target for m in spec.mounts if m.why.startswith("worktree git")]


def _planted(gitdir: str, **extra: str) -> dict[str, str]:
    """A `.git` file an agent wrote, naming `gitdir`, with files of its choice."""
    return {f"{WORKDIR}/.git": f"gitdir: {gitdir}\n", **extra}


@pytest.mark.parametrize(
    ("gitdir", "why"),
    [
        (HOME, "whole home"),  # the home itself
        ("/home", "whole home"),  # an ancestor of the home
        ("/", "whole home"),
        ("../..", "whole home"),  # relative, up to the home
        ("/home/bob", "whole home"),  # someone else's home
        (f"{HOME}/src", "holds the workdir"),  # an ancestor of the workdir
        (f"{HOME}/.ssh", "hidden path"),
        (f"{HOME}/.ssh/evil", "hidden path"),
        (f"{HOME}/.config/leviath", "hidden path"),
    ],
)
def test_a_git_file_naming_a_home_an_ancestor_or_a_hidden_path_binds_nothing(
    gitdir: str, why: str
) -> None:
    spec = spec_for(files=_planted(gitdir))
    assert _git_binds(spec) == []
    assert any(why in n and ".git names" in n for n in spec.notes), spec.notes


def test_a_git_file_naming_a_folder_that_is_no_git_folder_binds_nothing() -> None:
    # ~/.config is neither hidden nor a home: only its missing HEAD/objects/refs stop it.
    files = _planted(f"{HOME}/.config", **{
        f"{HOME}/.config/gitdir": f"{WORKDIR}/.git", f"{HOME}/.config/commondir": "..",
    })  # fmt: skip
    present = {f"{HOME}/.config", WORKDIR}
    spec = spec_for(files=files, existing=lambda p: p in present or not p.startswith(HOME))
    assert _git_binds(spec) == []
    assert any("not a git folder" in n for n in spec.notes), spec.notes


def test_a_git_folder_whose_gitdir_file_names_another_worktree_binds_nothing() -> None:
    files = _worktree_files()
    files["/repos/app/.git/worktrees/app/gitdir"] = "/elsewhere/.git\n"
    spec = spec_for(files=files)
    assert _git_binds(spec) == []
    assert any("does not name" in n for n in spec.notes), spec.notes


def test_a_git_folder_without_commondir_binds_nothing() -> None:
    files = _worktree_files()
    del files["/repos/app/.git/worktrees/app/commondir"]
    spec = spec_for(files=files)
    assert _git_binds(spec) == []
    assert any("no commondir" in n for n in spec.notes), spec.notes


def test_a_commondir_the_git_folder_is_not_a_worktree_of_binds_nothing() -> None:
    # A git folder the agent could write (say in ~/.claude) naming someone's real repository.
    files = {
        f"{WORKDIR}/.git": f"gitdir: {HOME}/.claude/fake\n",
        f"{HOME}/.claude/fake/gitdir": f"{WORKDIR}/.git\n",
        f"{HOME}/.claude/fake/commondir": "/repos/other/.git\n",
    }
    spec = spec_for(files=files)
    assert _git_binds(spec) == []
    assert any("/repos/other/.git/worktrees" in n for n in spec.notes), spec.notes


def test_a_commondir_naming_a_home_binds_nothing() -> None:
    files = {
        f"{WORKDIR}/.git": f"gitdir: {HOME}/worktrees/app\n",
        f"{HOME}/worktrees/app/gitdir": f"{WORKDIR}/.git\n",
        f"{HOME}/worktrees/app/commondir": "../..\n",
    }
    spec = spec_for(files=files)
    assert _git_binds(spec) == []
    assert any("whole home" in n for n in spec.notes), spec.notes


def test_a_git_folder_leading_by_a_link_into_a_hidden_path_binds_nothing() -> None:
    files = _worktree_files()

    def resolve(path: str) -> str:
        if is_within(path, "/repos/app/.git"):
            return f"{HOME}/.gnupg" + path[len("/repos/app/.git"):]
        return path

    spec = spec_for(files=files, resolve=resolve)
    assert _git_binds(spec) == []
    assert any("hidden path" in n for n in spec.notes), spec.notes


def test_a_workdir_leading_by_a_link_to_the_home_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="whole home"):
        spec_for(resolve=lambda p: HOME if p == WORKDIR else p)


def test_the_scratch_size_comes_from_the_config_with_a_default() -> None:
    assert spec_for().scratch_size == 1 << 30
    sized = spec_for(Effective(kind=SandboxKind.NAMESPACE, scratch_size=8 << 20))
    assert sized.scratch_size == 8 << 20
    assert SandboxSpec.from_dict(json.loads(json.dumps(sized.to_dict()))) == sized


def test_network_false_adds_a_network_namespace() -> None:
    host = spec_for(Effective(kind=SandboxKind.NAMESPACE, network=True))
    assert host.namespaces == ("ipc", "mnt", "pid", "uts")
    # The default (issue 30) is the proxy: a network namespace with only lo.
    assert spec_for().namespaces == ("ipc", "mnt", "net", "pid", "uts") and spec_for().proxy
    spec = spec_for(Effective(kind=SandboxKind.NAMESPACE, network=False))
    assert spec.namespaces == ("ipc", "mnt", "net", "pid", "uts") and not spec.network


def test_the_environment_is_allowlisted_and_secrets_never_arrive() -> None:
    spec = spec_for(env={"PATH": "/usr/bin", "GITHUB_TOKEN": "ghp_x", "HOME": "/elsewhere",
                         "AWS_SECRET_ACCESS_KEY": "k", "RANDOM_THING": "1"})
    assert spec.env["PATH"] == "/usr/bin"
    assert spec.env["HOME"] == HOME and spec.env["USER"] == "alice"
    for name in ("GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "RANDOM_THING"):
        assert name not in spec.env


def test_the_spec_survives_a_json_round_trip() -> None:
    spec = spec_for(files=_worktree_files(), mode="throwaway")
    again = SandboxSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec


def test_an_execution_id_cannot_climb_out_of_the_scratch_folder() -> None:
    with pytest.raises(InvalidArgument):
        build_spec(
            Effective(kind=SandboxKind.NAMESPACE), ALICE, RunRequest(("true",), WORKDIR),
            "../../etc", existing=everything_exists,
        )


def test_lev_inspect_says_whether_the_scratch_is_on_disk_or_in_memory() -> None:
    import dataclasses

    from leviathd.cli.inspect import render

    # A record of an agent started before issue 33 reads as the tmpfs it had.
    old = spec_for().to_dict()
    del old["scratch_fs"]
    assert SandboxSpec.from_dict(old).scratch_fs == "tmpfs"
    disk = dataclasses.replace(spec_for(), scratch_fs="ext4", scratch_size=1 << 30)
    line = next(ln for ln in render(disk).splitlines() if ln.startswith("scratch "))
    assert "on disk, its own ext4 of 1 GiB (not charged to memory_max)" in line
    memory = dataclasses.replace(disk, scratch_fs="tmpfs", scratch_size=48 << 20)
    line = next(ln for ln in render(memory).splitlines() if ln.startswith("scratch "))
    assert "in memory, a tmpfs of 48 MiB charged to memory_max" in line


def test_lev_inspect_says_who_acts_for_the_agent_and_in_which_view() -> None:
    """Issue 43 item 5: the file tools act in the fence's view (namespace),
    the host's otherwise; answers come only from outside every agent."""
    import dataclasses

    from leviathd.cli.inspect import render

    text = render(spec_for())
    part = text[text.index("acting for it:"):].splitlines()
    files = next(ln for ln in part if ln.strip().startswith("file tools"))
    assert "in this view" in files and "fence's mounts" in files
    assert any("only from outside every agent" in ln for ln in part)
    none = render(dataclasses.replace(spec_for(), kind=SandboxKind.NONE))
    files = next(ln for ln in none[none.index("acting for it:"):].splitlines()
                 if ln.strip().startswith("file tools"))
    assert "the host's view" in files
    # The engine: the user's in the agent's view, or (host_root_engine) root in the machine's.
    for note, says in (("container engine: the user's own rootless podman", "in this view"),
                       ("container engine: ROOT ON THE HOST ([sandbox.containers] ...)",
                        "ROOT ON THE HOST, in the machine's view")):
        spec = dataclasses.replace(spec_for(), env={"DOCKER_HOST": "unix:///x"}, notes=(note,))
        got = render(spec)
        engine = next(ln for ln in got[got.index("acting for it:"):].splitlines()
                      if ln.strip().startswith("container engine"))
        assert says in engine, engine


@pytest.mark.parametrize("asked, leads_to, refusal", [
    ("/proc", "/proc", "/proc is the kernel's"),
    ("/sys/fs", "/sys/fs", "/sys is the kernel's"),
    ("/dev", "/dev", "/dev is the kernel's"),
    # By another name: a link the agent made in its workdir, named by the
    # project's blueprint at the next run.
    (f"{WORKDIR}/p", "/proc", "leads to /proc"),
    (f"{WORKDIR}/h", HOME, "whole home folder"),
    (f"{WORKDIR}/r", "/", "whole home folder"),
])
def test_a_config_mount_of_the_kernels_folders_or_the_home_is_refused_by_any_name(
        asked: str, leads_to: str, refusal: str) -> None:
    """Red team (issue 45): a blueprint's `mounts = [{path = "/proc"}]` put
    the host's procfs over the agent's own, and /proc/PID/root of any of the
    user's host processes read every file (the CLIs' real logins among
    them); a writable mount of a link to the home gave the whole home."""
    eff = Effective(kind=SandboxKind.NAMESPACE,
                    mounts=[ConfigMount(path=asked, access=Access.WRITE)])

    def resolve(path: str) -> str:
        return leads_to + path[len(asked):] if is_within(path, asked) else path

    with pytest.raises(InvalidArgument, match=refusal):
        spec_for(eff, resolve=resolve)


def test_a_config_mount_of_the_agent_clis_state_under_another_name_is_refused() -> None:
    """Red team (issue 45): a writable mount of a link to ~/.claude (the
    agent made it in its workdir; the project's blueprint names it) showed
    settings.json, whose hooks run on the host, writable there: the fence
    protects it, and covers the login, where it lies by name."""
    eff = Effective(kind=SandboxKind.NAMESPACE,
                    mounts=[ConfigMount(path=f"{WORKDIR}/cl", access=Access.WRITE)])

    def resolve(path: str) -> str:
        if is_within(path, f"{WORKDIR}/cl"):
            return f"{HOME}/.claude" + path[len(f"{WORKDIR}/cl"):]
        return path

    with pytest.raises(InvalidArgument, match="under another name"):
        spec_for(eff, resolve=resolve)
    by_name = Effective(kind=SandboxKind.NAMESPACE,
                        mounts=[ConfigMount(path="~/.claude/projects", access=Access.WRITE)])
    assert binds(spec_for(by_name))[f"{HOME}/.claude/projects"].readonly is False


def test_a_writable_config_mount_of_claudes_state_file_is_refused() -> None:
    """Red team, round 2: a blueprint's writable mount of ~/.claude.json lay
    over the agent's copy (merged back through an allow-list): the host's
    claude would run the MCP server commands the agent wrote."""
    eff = Effective(kind=SandboxKind.NAMESPACE,
                    mounts=[ConfigMount(path="~/.claude.json", access=Access.WRITE)])
    with pytest.raises(InvalidArgument, match="refused writable"):
        spec_for(eff)
    read = Effective(kind=SandboxKind.NAMESPACE, mounts=[ConfigMount(path="~/.claude.json")])
    spec_for(read)


def test_a_config_mount_of_the_home_or_its_state_by_another_path_is_refused() -> None:
    """Red team, round 2: a bind mount of the home elsewhere on the host
    (/data/home/alice) is the same folder by a path no link shows; a config
    mount of it gave the whole home, writable. Decided on the folder itself
    (device and inode, as the user), as the real test in tests/root does."""
    ids = {HOME: (1, 2), "/data/home/alice": (1, 2), f"{HOME}/.claude": (1, 3),
           "/data/home/alice/.claude": (1, 3)}
    for alias, refusal in (("/data/home/alice", "whole home"),
                           ("/data/home/alice/.claude", "under another path")):
        eff = Effective(kind=SandboxKind.NAMESPACE,
                        mounts=[ConfigMount(path=alias, access=Access.WRITE)])
        with pytest.raises(InvalidArgument, match=refusal):
            build_spec(eff, ALICE, RunRequest(("claude",), WORKDIR), "0123abcd",
                       existing=everything_exists, file_id=ids.get)
