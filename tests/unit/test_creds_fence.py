"""The credential command's fence, computed from its agent's spec (issue 21):
nothing the agent can write is in it, unless `workdir = "ro"` shows the
workdir read-only. The bed tests (test_taint_exits.py) run it for real."""

from __future__ import annotations

import json
from typing import Any

import pytest

from leviathd.creds.fence import NOGROUP
from leviathd.creds.fence import credential_spec as _credential_spec
from leviathd.errors import Unavailable
from leviathd.sandbox.spec import SandboxSpec

HOME = "/home/alice"
WORK = "/home/alice/proj"


def credential_spec(agent: dict[str, Any], argv: list[str], env: dict[str, str],
                    **kw: Any) -> dict[str, Any]:
    """The fence from the agent's recorded spec (read back as records are),
    as the dict it is recorded and handed to the launcher as."""
    spec = _credential_spec(SandboxSpec.from_dict(agent), argv, env, **kw)
    return json.loads(json.dumps(spec.to_dict()))  # type: ignore[no-any-return]


def agent_spec(kind: str = "namespace") -> dict[str, Any]:
    return {
        "kind": kind, "argv": ["agent"], "env": {"LEVIATH_BROKER": "/run/leviath/broker.sock",
                                                   "AWS_PROFILE": "x"},
        "workdir": WORK, "workdir_mode": "rw", "uid": 1000, "gid": 1000, "groups": [1000],
        "user": "alice", "home": HOME, "sandbox_home": HOME,
        "mounts": [
            {"kind": "bind", "target": "/usr", "source": "/usr", "readonly": True,
             "why": "system"},
            {"kind": "symlink", "target": "/bin", "source": "usr/bin", "why": "system link"},
            {"kind": "proc", "target": "/proc", "why": "fresh /proc"},
            {"kind": "dev", "target": "/dev", "why": "minimal /dev"},
            {"kind": "bind", "target": HOME, "source": "/scratch/x/home", "why": "home (scratch)"},
            {"kind": "bind", "target": "/tmp", "source": "/scratch/x/tmp", "why": "tmp (scratch)"},
            {"kind": "bind", "target": WORK, "source": WORK, "why": "workdir"},
            {"kind": "bind", "target": f"{HOME}/.cargo/bin", "source": f"{HOME}/.cargo/bin",
             "why": "toolchain"},
            {"kind": "bind", "target": "/run/leviath", "source": "/run/leviath/agents/a",
             "readonly": True, "why": "broker socket"},
            {"kind": "mask", "target": f"{WORK}/.env", "why": "hidden"},
        ],
        "hidden": [], "namespaces": ["ipc", "mnt", "net", "pid", "uts"], "network": False,
        "scratch": "/scratch/x", "hostname": "leviath-x", "execution_id": "x",
    }


def _targets(spec: dict[str, Any]) -> list[tuple[str, str, bool]]:
    return [(m["kind"], m["target"], bool(m.get("readonly"))) for m in spec["mounts"]]


def test_nothing_the_agent_can_write_is_in_the_fence() -> None:
    spec = credential_spec(agent_spec(), ["git", "push"], {"PATH": "/usr/bin"}, workdir="none")
    sources = [m.get("source", "") for m in spec["mounts"]]
    assert not any(s.startswith(("/scratch", WORK, HOME, "/run/leviath")) for s in sources)
    assert ("tmpfs", HOME, False) in _targets(spec) and ("tmpfs", "/tmp", False) in _targets(spec)
    assert spec["workdir"] == HOME  # its working folder is the private home
    assert spec["env"] == {"PATH": "/usr/bin", "HOME": HOME, "USER": "alice", "LOGNAME": "alice"}
    assert spec["argv"] == ["git", "push"]
    assert spec["network"] is True and "net" not in spec["namespaces"]
    assert spec["real_gid"] == NOGROUP
    # Nothing of the agent's scratch is in it: no ext4 is made per call.
    assert spec["scratch_fs"] == "tmpfs"


def test_workdir_ro_shows_the_workdir_read_only_and_keeps_its_masks() -> None:
    spec = credential_spec(agent_spec(), ["x"], {}, workdir="ro")
    targets = _targets(spec)
    assert ("bind", WORK, True) in targets and ("bind", WORK, False) not in targets
    assert targets.index(("bind", WORK, True)) < targets.index(("mask", f"{WORK}/.env", False))
    assert spec["workdir"] == HOME


def test_beside_a_kind_none_agent_it_runs_in_roots_empty_folder() -> None:
    private = "/run/leviath/agents/a/credential-home"
    spec = credential_spec(agent_spec("none"), ["x"], {"PATH": "/usr/bin"}, workdir="none",
                           private_dir=private)
    assert spec["workdir"] == private and spec["env"]["HOME"] == private
    assert "LEVIATH_BROKER" not in spec["env"] and spec["real_gid"] == NOGROUP


@pytest.mark.parametrize("kind, private", [("none", ""), ("container", "/x")])
def test_no_other_agent_can_run_credential_commands(kind: str, private: str) -> None:
    with pytest.raises(Unavailable):
        credential_spec(agent_spec(kind), ["x"], {}, workdir="none", private_dir=private)
