"""Protected paths in the spec (issue 10 §1): pure, every answer about the host
passed in. The launchers' side is tests/integration/test_protected_paths.py."""

from __future__ import annotations

import pytest
from test_sandbox_spec import HOME, WORKDIR, _worktree_files, spec_for

from leviathd.config.merge import Effective, resolve
from leviathd.config.models import Config, SandboxConfig, SandboxKind
from leviathd.domain.protectedpaths import check_config_path
from leviathd.errors import InvalidArgument
from leviathd.sandbox.spec import SandboxSpec


def protected(spec: SandboxSpec) -> dict[str, tuple[bool, str]]:
    """target -> (read-only, what to make when missing)"""
    return {m.target: (m.readonly, m.source) for m in spec.mounts if m.kind == "protect"}


def test_the_workdirs_git_files_that_run_code_are_read_only_and_the_git_folder_pinned() -> None:
    p = protected(spec_for())
    for name in ("config", "config.worktree"):
        assert p[f"{WORKDIR}/.git/{name}"] == (True, "file")
    for name in ("hooks", "info"):
        assert p[f"{WORKDIR}/.git/{name}"] == (True, "dir")
    assert p[f"{WORKDIR}/.git"] == (False, "dir")


def test_agent_tool_settings_are_read_only_in_the_home_and_the_workdir() -> None:
    p = protected(spec_for())
    for rel in (".claude/settings.json", ".claude/settings.local.json", ".codex/config.toml",
                ".gemini/settings.json", ".config/opencode/opencode.json"):  # fmt: skip
        assert p[f"{HOME}/{rel}"] == (True, "file"), rel
    assert p[f"{HOME}/.claude/plugins"] == (True, "dir")
    # Claude Code's local install: the host's `claude` alias runs it (red team).
    assert p[f"{HOME}/.claude/local"] == (True, "dir")
    assert p[f"{WORKDIR}/.claude/settings.local.json"] == (True, "file")
    assert p[f"{WORKDIR}/.claude"] == (False, "dir")


def test_a_missing_tool_folder_in_the_workdir_is_an_empty_read_only_folder() -> None:
    missing = {f"{WORKDIR}/.claude", f"{WORKDIR}/.claude/settings.json",
               f"{WORKDIR}/.claude/settings.local.json"}  # fmt: skip
    p = protected(spec_for(existing=lambda path: path not in missing))
    assert p[f"{WORKDIR}/.claude"] == (True, "dir")
    assert f"{WORKDIR}/.claude/settings.json" not in p


def test_a_tool_the_user_does_not_have_leaves_the_workdir_alone() -> None:
    absent = (f"{HOME}/.gemini", f"{WORKDIR}/.gemini")
    p = protected(spec_for(existing=lambda path: not path.startswith(absent)))
    assert not any(t.startswith(f"{WORKDIR}/.gemini") for t in p)
    assert f"{HOME}/.gemini/settings.json" not in p  # ~/.gemini is not mounted at all


def test_nothing_is_protected_where_the_agent_cannot_write_the_host() -> None:
    for mode in ("ro", "throwaway"):
        p = protected(spec_for(mode=mode))
        assert not any(t.startswith(WORKDIR) for t in p), mode


def test_a_worktrees_own_and_common_git_folders_and_its_git_file_are_protected() -> None:
    p = protected(spec_for(files=_worktree_files()))
    assert p[f"{WORKDIR}/.git"] == (True, "file")
    assert p["/repos/app/.git/config"] == (True, "file")
    assert p["/repos/app/.git/hooks"] == (True, "dir")
    assert p["/repos/app/.git/worktrees/app/config.worktree"] == (True, "file")
    assert p["/repos/app/.git/worktrees/app"] == (False, "dir")
    # The common folder is a mount of its own: already pinned.
    assert "/repos/app/.git" not in p


def test_submodules_are_found_through_gitmodules_and_their_git_files() -> None:
    files = {
        f"{WORKDIR}/.gitmodules": '[submodule "lib"]\n\tpath = vendor/lib\n\turl = x\n'
                                  '[submodule "out"]\n\tpath = ../../escape\n',
        f"{WORKDIR}/vendor/lib/.git": "gitdir: ../../.git/modules/lib\n",
    }
    p = protected(spec_for(files=files))
    assert p[f"{WORKDIR}/.git/modules/lib/config"] == (True, "file")
    assert p[f"{WORKDIR}/.git/modules/lib/hooks"] == (True, "dir")
    assert p[f"{WORKDIR}/vendor/lib/.git"] == (True, "file")
    assert not any("escape" in t for t in p)


def test_protected_paths_from_the_config_are_added() -> None:
    eff = Effective(kind=SandboxKind.NAMESPACE, protected_paths=[".envrc", "~/.bashrc.d/",
                                                                   "/srv/x/hooks.json"])
    p = protected(spec_for(eff))
    assert p[f"{WORKDIR}/.envrc"] == (True, "file")
    # Not in a folder the agent may write: nothing to do.
    assert f"{HOME}/.bashrc.d" not in p and "/srv/x/hooks.json" not in p


@pytest.mark.parametrize("bad", ["", "~", "~/", "../x", "a/../b", "./", "x\ny"])
def test_a_bad_protected_path_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        check_config_path(bad)


def test_every_config_layer_may_add_protected_paths_and_none_remove_them() -> None:
    machine = Config(sandbox=SandboxConfig(protected_paths=[".envrc"]))
    user = Config(sandbox=SandboxConfig(protected_paths=["Makefile"]))
    eff = resolve(machine, user, None, "a").agent
    assert eff.protected_paths == [".envrc", "Makefile"]


def test_a_bad_entry_that_reaches_the_spec_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        spec_for(Effective(kind=SandboxKind.NAMESPACE, protected_paths=["../up"]))


def test_the_spec_keeps_its_protect_mounts_through_json() -> None:
    spec = spec_for()
    assert SandboxSpec.from_dict(spec.to_dict()) == spec


def test_aiders_config_is_read_only_in_the_home_and_the_workdir() -> None:
    p = protected(spec_for())
    # ~/.aider.conf.yml is a mount of its own: covered all the same.
    assert p[f"{HOME}/.aider.conf.yml"] == (True, "file")
    assert p[f"{WORKDIR}/.aider.conf.yml"] == (True, "file")
    no_aider = (f"{HOME}/.aider", f"{WORKDIR}/.aider")
    p = protected(spec_for(existing=lambda path: not path.startswith(no_aider)))
    assert f"{WORKDIR}/.aider.conf.yml" not in p


def test_a_git_folder_that_links_out_of_the_workdir_is_left_alone() -> None:
    def resolve(path: str) -> str:
        dotgit = f"{WORKDIR}/.git"
        return "/elsewhere/repo.git" + path[len(dotgit):] if path.startswith(dotgit) else path

    p = protected(spec_for(resolve=resolve))
    assert not any(t.startswith(f"{WORKDIR}/.git") for t in p)


def test_a_state_folder_that_is_a_link_keeps_its_settings_protected() -> None:
    def resolve(path: str) -> str:
        claude = f"{HOME}/.claude"
        return "/data/alice/claude" + path[len(claude):] if path.startswith(claude + "/") or \
            path == claude else path

    p = protected(spec_for(resolve=resolve))
    assert p[f"{HOME}/.claude/settings.json"] == (True, "file")


def test_kind_none_lists_no_protected_paths_it_could_not_apply() -> None:
    assert not protected(spec_for(Effective(kind=SandboxKind.NONE)))
