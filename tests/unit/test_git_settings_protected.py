"""Issues 31 §5 and 48 §1: what git settings name in a folder the agent may
write is read-only too, found by asking the real git (sandbox/gitask.py) and
resolved by git's rules (sandbox/gitsettings.py). The bed side, from inside
an agent: tests/integration/test_git_settings_bed.py.

Each repository here is a real one, made with the real git in a temporary
folder; the settings are git's own answer. Seen failing on the old reader
(sandbox/gitsettings.py before issue 48): the enclosing repository of a
subfolder workdir, a config over 64 KiB, a linked ~/.gitconfig, the
`!f() { ./x.sh; }; f` alias, a `$HOME/...` word, and the command keys it did
not list named nothing."""

from __future__ import annotations

import os
import posixpath
import subprocess
from pathlib import Path

from test_protected import protected
from test_sandbox_spec import ALICE, HOME, WORKDIR, everything_exists

from leviathd.config.merge import Effective
from leviathd.config.models import SandboxKind
from leviathd.sandbox import gitask
from leviathd.sandbox.gitask import GitView, Setting
from leviathd.sandbox.gitsettings import command_paths, named_paths
from leviathd.sandbox.spec import RunRequest, build_spec


def _git(cwd: Path, *args: str, home: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def _runner(home: Path) -> gitask.Runner:
    return gitask.Runner(os.getuid(), os.getgid(), (), str(home))


def _named(view: GitView, home: Path) -> dict[str, bool]:
    return {n.path: n.folder for n in named_paths([view], home=str(home),
                                                   is_file=os.path.isfile)}


def test_a_subfolder_workdir_gets_what_the_enclosing_repository_names(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mono = tmp_path / "mono"
    (mono / "frontend" / ".husky" / "_").mkdir(parents=True)
    _git(mono, "init", "-q", home=home)
    _git(mono, "config", "core.hooksPath", "frontend/.husky/_", home=home)
    view = gitask.ask(_runner(home), str(mono / "frontend"))
    assert view.top == str(mono)
    named = _named(view, home)
    assert named[f"{mono}/frontend/.husky/_"] is True
    assert named[f"{mono}/frontend/.husky"] is True  # husky 9 runs .husky/<hook>


def test_includes_and_any_size_are_read_by_git(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", home=home)
    with open(repo / ".git" / "config", "a") as f:
        f.write("[alias]\n" + "".join(f"\ta{i} = log --oneline -n {i}\n" for i in range(4000)))
        f.write("[include]\n\tpath = ../conf/extra.gitconfig\n")
        f.write('[includeIf "onbranch:release"]\n\tpath = ../conf/release.gitconfig\n')
    assert os.path.getsize(repo / ".git" / "config") > 65536
    (repo / "conf").mkdir()
    (repo / "conf" / "extra.gitconfig").write_text("[core]\n\tfsmonitor = tools/fsmon\n")
    (repo / "conf" / "release.gitconfig").write_text("[remote \"o\"]\n\tuploadpack = ./up\n")
    named = _named(gitask.ask(_runner(home), str(repo)), home)
    assert f"{repo}/conf/extra.gitconfig" in named
    assert f"{repo}/tools/fsmon" in named
    assert f"{repo}/conf/release.gitconfig" in named  # its condition does not hold now
    assert f"{repo}/up" in named  # ... but what it names counts


def test_a_linked_global_config_is_followed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "dotfiles").mkdir(parents=True)
    (home / "dotfiles" / "gitconfig").write_text(
        "[difftool \"x\"]\n\tcmd = ~/dotfiles/bin/dt \"$LOCAL\"\n"
        "[core]\n\tgitProxy = $HOME/proxy.sh\n"
    )
    (home / ".gitconfig").symlink_to("dotfiles/gitconfig")
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", home=home)
    named = _named(gitask.ask(_runner(home), str(repo)), home)
    assert f"{home}/dotfiles/bin/dt" in named
    assert f"{home}/proxy.sh" in named
    assert f"{home}/.gitconfig" in named


def test_linked_worktrees_admin_folders_are_listed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main", home=home)
    _git(repo, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "--allow-empty",
         "-m", "one", home=home)
    _git(repo, "worktree", "add", "-q", "-b", "other", str(tmp_path / "wt"), home=home)
    view = gitask.ask(_runner(home), str(repo))
    assert view.worktree_admins == (f"{repo}/.git/worktrees/wt",)
    assert str(tmp_path / "wt") in view.worktrees
    linked = gitask.ask(_runner(home), str(tmp_path / "wt"))
    assert linked.common_dir == f"{repo}/.git"
    assert linked.git_dir == f"{repo}/.git/worktrees/wt"


def test_shell_words_are_read_like_the_shell_would() -> None:
    def paths(cmd: str) -> dict[str, bool]:
        return {n.path: n.folder for n in command_paths(
            cmd, home="/h", bases=["/t"], is_file=lambda p: p == "/t/run.sh")}

    assert paths("!f() { ./x.sh; }; f") == {"/t/x.sh": False}
    assert paths("$HOME/bin/x --opt=./y") == {"/h/bin/x": False, "/t/y": False}
    assert paths("./scripts/$X.sh") == {"/t/scripts": True}  # the whole folder
    assert paths("sh -c './a b' && sh run.sh") == {"/t/a b": False, "/t/a": False,
                                                   "/t/run.sh": False}
    assert paths("PATH=./bin:$PATH make") == {"/t/bin": False}
    assert paths("git -c core.pager=./pg log") == {"/t/pg": False}


def _view(settings: list[tuple[str, str]], **kw: object) -> GitView:
    origin = f"{WORKDIR}/.git/config"
    return GitView(WORKDIR, top=WORKDIR, git_dir=f"{WORKDIR}/.git",
                   common_dir=f"{WORKDIR}/.git",
                   settings=tuple(Setting("local", origin, k, v) for k, v in settings),
                   **kw)  # type: ignore[arg-type]


def _spec(views: list[GitView], effective: Effective | None = None,
          existing: object = everything_exists,
          links: dict[str, str] | None = None) -> dict[str, tuple[bool, str]]:
    def resolve(path: str) -> str:
        for name, to in (links or {}).items():
            if path == name or path.startswith(name + "/"):
                return to + path[len(name):]
        return path

    return protected(build_spec(
        effective or Effective(kind=SandboxKind.NAMESPACE), ALICE,
        RunRequest(("claude",), WORKDIR, "rw", {}), "0123abcd",
        existing=existing,  # type: ignore[arg-type]
        resolve=resolve, read_text=lambda _p: None, ask_git=lambda _w: views,
    ))


def test_every_command_key_of_the_issue_names_its_script() -> None:
    keys = ["remote.origin.uploadpack", "difftool.x.cmd", "mergetool.y.cmd", "core.gitProxy",
            "trailer.sign.command", "gpg.ssh.defaultKeyCommand", "core.alternateRefsCommand",
            "core.fsmonitor", "core.sshCommand", "filter.lfs.process", "diff.img.textconv",
            "credential.helper", "sequence.editor", "core.editor", "core.pager", "pager.log",
            "alias.st", "uploadpack.packObjectsHook", "gc.recentObjectsHook"]
    p = _spec([_view([(k, f"./bin/{i}") for i, k in enumerate(keys)])])
    for i, k in enumerate(keys):
        assert p.get(f"{WORKDIR}/bin/{i}") == (True, "file"), k


def test_worktree_admin_folders_husky_and_the_global_config_in_a_grant() -> None:
    admin = f"{WORKDIR}/.git/worktrees/other"
    views = [_view([("core.hookspath", ".husky/_")], worktree_admins=(admin,))]
    from leviathd.domain.mounts import MountRequest
    eff = Effective(kind=SandboxKind.NAMESPACE,
                    mounts=[MountRequest(path="~/.config", access="write")])  # type: ignore[arg-type]
    p = _spec(views, eff)
    assert p[admin] == (False, "dir")
    for name in ("commondir", "gitdir", "config.worktree"):
        assert p[posixpath.join(admin, name)] == (True, "file"), name
    assert p[f"{WORKDIR}/.husky"] == (True, "dir")
    assert p[f"{WORKDIR}/.husky/_"] == (True, "dir")
    assert p[f"{HOME}/.config/git/config"] == (True, "file")


def test_tracked_hook_managers_files_are_read_only_where_they_exist() -> None:
    there = {f"{WORKDIR}/lefthook.yml", f"{WORKDIR}/.envrc", f"{WORKDIR}/.devcontainer"}

    def exists(path: str) -> bool:
        return not path.startswith(WORKDIR + "/") or path in there or path.startswith(
            f"{WORKDIR}/.git")

    p = _spec([_view([])], existing=exists)
    assert p[f"{WORKDIR}/lefthook.yml"] == (True, "file")
    assert p[f"{WORKDIR}/lefthook-local.yml"] == (True, "file")  # merged in by lefthook
    assert p[f"{WORKDIR}/.envrc"] == (True, "file")
    assert p[f"{WORKDIR}/.devcontainer"] == (True, "dir")
    assert f"{WORKDIR}/.pre-commit-config.yaml" not in p  # none: no empty file made


def test_the_workdir_and_home_themselves_are_never_protected() -> None:
    p = _spec([_view([("core.hookspath", "."), ("core.fsmonitor", "./watch")])])
    assert WORKDIR not in p or p[WORKDIR][0] is False
    assert p[f"{WORKDIR}/watch"] == (True, "file")


def test_a_boolean_fsmonitor_names_nothing() -> None:
    named = named_paths([_view([("core.fsmonitor", "true")])], home=HOME,
                        is_file=lambda _p: True)
    assert [n.path for n in named] == [f"{WORKDIR}/.git/config"]


def test_the_folders_above_a_named_target_are_pinned_up_to_the_workdir() -> None:
    p = _spec([_view([("core.hookspath", "tools/git/hooks")])])
    assert p[f"{WORKDIR}/tools/git/hooks"] == (True, "dir")
    assert p[f"{WORKDIR}/tools/git"] == (False, "dir")
    assert p[f"{WORKDIR}/tools"] == (False, "dir")


def test_a_repository_given_in_hook_files_writable_keeps_its_hook_files_writable() -> None:
    there = {f"{WORKDIR}/.husky", f"{WORKDIR}/.envrc"}

    def exists(path: str) -> bool:
        return not path.startswith(WORKDIR + "/") or path in there or path.startswith(
            f"{WORKDIR}/.git")

    given = Effective(kind=SandboxKind.NAMESPACE, hook_files_writable=["~/src/app"])
    p = _spec([_view([])], given, existing=exists)
    assert f"{WORKDIR}/.husky" not in p and f"{WORKDIR}/.envrc" not in p
    assert p[f"{WORKDIR}/.git/config"] == (True, "file")  # untracked config: always
    other = Effective(kind=SandboxKind.NAMESPACE, hook_files_writable=["~/src/other"])
    assert _spec([_view([])], other, existing=exists)[f"{WORKDIR}/.husky"] == (True, "dir")


def test_hook_files_writable_comes_from_the_machine_and_user_configs_not_a_blueprint() -> None:
    from leviathd.config.load import parse_blueprint, parse_config
    from leviathd.config.merge import resolve

    machine = parse_config('[sandbox]\nhook_files_writable = ["/srv/m"]\n', "m.toml")
    user = parse_config('[sandbox]\nhook_files_writable = ["~/src/app"]\n', "u.toml")
    bp = parse_blueprint('[agent]\nname = "b"\ncommand = ["x"]\n'
                         '[sandbox]\nhook_files_writable = ["~/evil"]\n', "b.toml")
    got = resolve(machine, user, bp, "b")
    assert got.agent.hook_files_writable == ["/srv/m", "~/src/app"]
    assert any(f.code == "hook-files-ignored" for f in got.findings)


def test_a_named_path_that_links_into_the_workdir_is_protected_where_it_leads() -> None:
    # ~/githooks (not writable: the home is scratch) links to the workdir's tools/hooks
    p = _spec([_view([("core.hookspath", f"{HOME}/githooks")])],
              links={f"{HOME}/githooks": f"{WORKDIR}/tools/hooks"})
    assert p[f"{WORKDIR}/tools/hooks"] == (True, "dir")


def test_a_git_that_cannot_answer_refuses_the_start(tmp_path: Path, monkeypatch: object) -> None:
    import pytest

    from leviathd.errors import Unavailable

    mp: pytest.MonkeyPatch = monkeypatch  # type: ignore[assignment]
    slow = tmp_path / "slow-git"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    chatty = tmp_path / "chatty-git"
    chatty.write_text("#!/bin/sh\nexec yes\n")
    chatty.chmod(0o755)
    mp.setattr(gitask, "TIMEOUT", 0.5)
    mp.setattr(gitask, "MAX_OUTPUT", 1 << 16)
    for fake in (slow, chatty):
        mp.setattr(gitask, "GIT", str(fake))
        with pytest.raises(Unavailable):
            gitask.ask(_runner(tmp_path), str(tmp_path))
    mp.setattr(gitask, "GIT", str(tmp_path / "no-git-here"))
    assert gitask.ask(_runner(tmp_path), str(tmp_path)).settings == ()  # no git: nothing runs
