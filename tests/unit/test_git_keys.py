"""Issue 48 §1: every setting the installed git knows is classified by the
table in sandbox/gitkeys.py as naming a command, a path, or neither. A git
that learns a new key fails this test until the key is classified."""

from __future__ import annotations

import subprocess

from leviathd.sandbox import gitkeys


def _documented() -> list[str]:
    out = subprocess.run(["git", "help", "--config"], capture_output=True, text=True,
                         check=False, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"}).stdout
    return [k for k in out.splitlines() if k and "." in k and not k.startswith("'")]


def test_the_installed_git_knows_no_key_the_table_does_not_classify() -> None:
    keys = _documented()
    assert len(keys) > 400, keys[:5]  # the list really came
    assert [k for k in keys if not gitkeys.known(k)] == []


def test_the_issues_command_keys_are_commands() -> None:
    for key in ("remote.origin.uploadpack", "remote.o.receivepack", "difftool.x.cmd",
                "mergetool.y.cmd", "core.gitProxy", "trailer.sign.command",
                "gpg.ssh.defaultKeyCommand", "core.alternateRefsCommand", "core.fsmonitor",
                "core.sshCommand", "filter.lfs.process", "filter.lfs.smudge",
                "diff.img.textconv", "credential.helper", "credential.https://x.y.helper",
                "sequence.editor", "core.editor", "core.pager", "pager.log", "alias.st",
                "alias.st.command", "hook.lint.command", "gc.recentObjectsHook"):
        assert gitkeys.classify(key) == "command", key
    assert gitkeys.classify("core.hooksPath") == "folder"
    assert gitkeys.classify("includeIf.gitdir:/a/b.c/.path") == "path"
    for key in ("user.name", "remote.origin.url", "color.diff.meta", "advice.detachedHead"):
        assert gitkeys.classify(key) == "neither", key
    assert gitkeys.classify("some.tool.key") == "command"  # unknown: the careful side
