"""The container kind's settings as pure values: what `podman run` and `podman
exec` are asked for, the warm container's key, the cgroup files the engine
joins, and the engine/runtime/ulimit choices. No root, no engine."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from leviathd.config.merge import Effective
from leviathd.config.models import Resources, SandboxKind
from leviathd.domain.mounts import Access
from leviathd.domain.mounts import MountRequest as ConfigMount
from leviathd.errors import InvalidArgument, Unavailable
from leviathd.identity import UserInfo
from leviathd.sandbox import container
from leviathd.sandbox import engine as engines
from leviathd.sandbox.container import availability as c_availability
from leviathd.sandbox.container import cgroups as c_cgroups
from leviathd.sandbox.container import records as c_records
from leviathd.sandbox.container import settings as c_settings
from leviathd.sandbox.container import start as c_start
from leviathd.sandbox.container import worker as c_worker
from leviathd.sandbox.spec import Mount, RunRequest, SandboxSpec, build_spec

HOME = "/home/alice"
ALICE = UserInfo("alice", 1000, 1000, (1000, 27, 990), HOME, "/bin/bash")
WORKDIR = f"{HOME}/src/app"
PODMAN = engines.DetectedEngine("podman", "/usr/bin/podman", "runc")
DOCKER = engines.DetectedEngine("docker", "/usr/bin/docker", None)
ULIMITS = {"nofile": (1024, 1024), "nproc": (4096, 4096)}


def eff(**kw: object) -> Effective:
    base: dict[str, object] = {"kind": SandboxKind.CONTAINER, "image": "localhost/img:1",
                             "network": True}
    base.update(kw)
    return Effective(**base)  # type: ignore[arg-type]


def spec_for(
    effective: Effective,
    *,
    mode: str = "rw",
    env: dict[str, str] | None = None,
    existing: Callable[[str], bool] = lambda _p: True,
) -> SandboxSpec:
    return build_spec(
        effective, ALICE,
        RunRequest(("sh", "-c", "echo hi"), WORKDIR, mode, dict(env or {})),  # type: ignore[arg-type]
        "0123abcd", existing=existing, links={"/bin": "usr/bin"},
    )  # fmt: skip


def options(
    effective: Effective, engine: engines.DetectedEngine = PODMAN, **kw: object
) -> list[str]:
    spec = spec_for(effective, **kw)  # type: ignore[arg-type]
    return c_settings.container_options(
        spec, effective, engine, ulimits=ULIMITS,
        network=engines.network_mode(spec.network), init="/usr/bin/catatonit",
        exists=lambda p: p.endswith(("secret", "token", "/etc/leviath")),
        is_dir=lambda p: p.endswith(("secret", "/etc/leviath")),
    )  # fmt: skip


def pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_every_capability_is_dropped_and_privileges_cannot_be_regained() -> None:
    o = options(eff())
    assert pairs(o, "--cap-drop") == ["all"]
    no_new_privs, profile = pairs(o, "--security-opt")
    assert no_new_privs == "no-new-privileges"
    # Issue 10: the machine's seccomp profile, named by a hash of its text.
    assert re.fullmatch(r"seccomp=/run/leviath/seccomp/seccomp-[0-9a-f]{16}\.json", profile)
    assert "--privileged" not in o and "--cap-add" not in o


def test_pids_and_memory_are_capped_from_the_effective_resources_without_swap() -> None:
    o = options(eff(resources=Resources(memory_max=64 << 20, tasks_max=40, cpu_quota=150)))
    assert pairs(o, "--pids-limit") == ["40"]
    assert pairs(o, "--memory") == [str(64 << 20)]
    assert pairs(o, "--memory-swap") == [str(64 << 20)]
    assert pairs(o, "--cpus") == ["1.50"]
    unlimited = options(eff())
    assert "--pids-limit" not in unlimited and "--memory" not in unlimited


def test_network_false_means_no_network_and_true_the_hosts_unless_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(engines.NETWORK_ENV, raising=False)
    assert pairs(options(eff(network=False)), "--network") == ["none"]
    assert pairs(options(eff(network=True)), "--network") == ["host"]
    monkeypatch.setenv(engines.NETWORK_ENV, "pasta")
    assert pairs(options(eff(network=True)), "--network") == ["pasta"]
    assert pairs(options(eff(network=False)), "--network") == ["none"]


def test_the_init_runs_as_a_uid_the_agent_lacks_and_identity_files_are_the_daemons() -> None:
    o = options(eff())
    assert pairs(o, "--user") == ["65534:65534"]
    assert pairs(o, "--group-add") == []
    assert pairs(o, "--workdir") == ["/"]
    mounts = pairs(o, "--mount")
    for name in ("passwd", "group"):
        src = f"/run/leviath/containers/0123abcd/{name}"
        assert f"type=bind,source={src},destination=/etc/{name},ro=true" in mounts
    assert f"{HOME}:rw,nosuid,nodev,mode=0700" in pairs(o, "--tmpfs")  # chowned once it runs
    docker = options(eff(), DOCKER)
    assert f"{HOME}:rw,nosuid,nodev,mode=0700,uid=1000,gid=1000" in pairs(docker, "--tmpfs")
    spec = spec_for(eff())
    with pytest.raises(InvalidArgument, match="65534"):
        c_settings.container_options(
            dataclasses.replace(spec, uid=65534), eff(), PODMAN, ulimits=ULIMITS,
            network="none", init=None,
        )  # fmt: skip


def test_the_identity_files_give_the_user_exactly_its_groups_and_no_numeric_names() -> None:
    names = {1000: "alice", 27: "sudo", 990: "1001"}
    files = c_settings.identity_files(spec_for(eff()), lambda g: names[g])
    assert f"alice:x:1000:1000::{HOME}:/bin/sh" in files["passwd"].splitlines()
    group = files["group"].splitlines()
    assert "alice:x:1000:alice" in group and "sudo:x:27:alice" in group
    # A name of digits would be read as a gid by the runtime: renamed.
    assert "g990:x:990:alice" in group
    assert not any(line.split(":")[0].isdigit() for line in group)


def test_the_workdir_is_bound_read_write_at_its_own_path_and_read_mounts_stay_read_only() -> None:
    e = eff(mounts=[ConfigMount(path="/srv/data", access=Access.READ),
                    ConfigMount(path="/srv/out", access=Access.WRITE)])  # fmt: skip
    mounts = pairs(options(e), "--mount")
    assert f"type=bind,source={WORKDIR},destination={WORKDIR}" in mounts
    assert "type=bind,source=/srv/data,destination=/srv/data,ro=true" in mounts
    assert "type=bind,source=/srv/out,destination=/srv/out" in mounts
    ro = pairs(options(eff(), mode="ro"), "--mount")
    assert f"type=bind,source={WORKDIR},destination={WORKDIR},ro=true" in ro


def test_binds_added_by_spec_extensions_reach_the_container_read_only_as_given() -> None:
    spec = spec_for(eff())
    broker = Mount("bind", "/run/leviath", "/run/leviath/agents/0123abcd", readonly=True,
                   why="tool broker socket")  # fmt: skip
    spec = dataclasses.replace(spec, mounts=(*spec.mounts, broker))
    o = c_settings.mount_options(spec, "podman", exists=lambda _p: False)
    want = "type=bind,source=/run/leviath/agents/0123abcd,destination=/run/leviath,ro=true"
    assert o[-2:] == ["--mount", want]


def test_a_throwaway_workdir_is_an_overlay_and_docker_refuses_it() -> None:
    assert f"{WORKDIR}:{WORKDIR}:O" in pairs(options(eff(), mode="throwaway"), "-v")
    with pytest.raises(InvalidArgument, match="throwaway"):
        options(eff(), DOCKER, mode="throwaway")


def test_nothing_of_the_host_system_home_or_hidden_paths_is_mounted() -> None:
    on_host = {"/usr", "/etc", "/var/lib/leviath", "/etc/leviath", f"{HOME}/.ssh",
               f"{HOME}/.ssh/id_ed25519", f"{HOME}/.aws", WORKDIR}  # fmt: skip
    o = options(eff(), existing=on_host.__contains__)
    sources = [m.split(",")[1].removeprefix("source=") for m in pairs(o, "--mount")
               if m.startswith("type=bind")]  # fmt: skip
    # (and the container's /etc/passwd and /etc/group, which the daemon writes)
    ids = [f"/run/leviath/containers/0123abcd/{n}" for n in ("passwd", "group")]
    assert sources == [WORKDIR, *ids, "/usr/bin/catatonit"]
    # The home and /tmp are the container's own, empty.
    tmpfs = pairs(o, "--tmpfs")
    assert tmpfs[0].startswith("/tmp:") and tmpfs[1].startswith(f"{HOME}:")


def test_a_hidden_path_inside_a_mounted_folder_is_covered_when_it_exists() -> None:
    e = eff(mounts=[ConfigMount(path="/srv/data", access=Access.READ)],
            hidden_paths=["/srv/data/secret", "/srv/data/token", "/srv/data/absent"])  # fmt: skip
    o = options(e)
    mounts = pairs(o, "--mount")
    assert "/srv/data/secret:ro,mode=000,nosuid,nodev,noexec,notmpcopyup" in pairs(o, "--tmpfs")
    assert "type=bind,source=/dev/null,destination=/srv/data/token,ro=true" in mounts
    assert not any("absent" in m for m in mounts + pairs(o, "--tmpfs"))
    # Hidden things under system folders are moot: the image replaces them.
    assert not any("/etc/leviath" in m for m in mounts + pairs(o, "--tmpfs"))
    assert "notmpcopyup" not in " ".join(options(e, DOCKER))


def test_paths_that_would_break_the_mount_syntax_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="cannot be mounted"):
        options(eff(mounts=[ConfigMount(path="/srv/a,b", access=Access.READ)]))


def test_identical_settings_share_a_key_and_any_difference_gets_another() -> None:
    def key(e: Effective, **kw: object) -> str:
        return c_settings.config_key(options(e, **kw), e.image or "", PODMAN)  # type: ignore[arg-type]

    base = key(eff())
    assert base == key(eff())
    assert base != key(eff(network=False))
    assert base != key(eff(image="localhost/other:1"))
    assert base != key(eff(resources=Resources(tasks_max=10)))
    assert base != key(eff(), mode="ro")
    assert c_settings.container_name("0123abcd", base) == f"leviath-0123abcd-{base}"


def test_labels_name_the_agent_the_user_the_daemon_instance_and_the_settings() -> None:
    spec = spec_for(eff())
    lab = pairs(c_settings.labels(spec, "k" * 12, "d" * 16), "--label")
    assert lab == ["org.leviath.agent=0123abcd", "org.leviath.user=alice",
                   f"org.leviath.daemon={'d' * 16}", f"org.leviath.config={'k' * 12}"]  # fmt: skip


def test_secrets_in_the_environment_travel_by_name_not_on_the_command_line() -> None:
    spec = container.with_container(
        spec_for(eff(), env={"LANG": "C.UTF-8"}), "leviath-0123abcd-000000000000"
    )
    spec = spec.__class__(**{**spec.__dict__, "env": {**spec.env, "API_KEY": "s3cret",
                                                      "CONTAINERS_CONF": "/tmp/evil"}})  # fmt: skip
    argv = c_worker.exec_argv(spec.hostname, spec, PODMAN)
    assert "s3cret" not in " ".join(argv)
    assert pairs(argv, "-e").count("API_KEY") == 1
    env = c_worker.exec_env(spec)
    assert env["API_KEY"] == "s3cret"
    # A name the engine itself reads must not configure it: value on argv only.
    assert "CONTAINERS_CONF" not in env and "CONTAINERS_CONF=/tmp/evil" in pairs(argv, "-e")
    assert env["HOME"] == "/root" and "NOTIFY_SOCKET" not in env
    assert argv[-4:] == ["leviath-0123abcd-000000000000", "sh", "-c", "echo hi"]
    # The agent's numeric ids, nothing for the engine to look up in the container.
    assert pairs(argv, "--user") == ["1000:1000"] and pairs(argv, "--workdir") == [WORKDIR]


def test_the_engine_joins_every_mounted_hierarchy_of_the_scope() -> None:
    mountinfo = "\n".join([
        "30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755",
        "31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw",
        "32 30 0:28 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd",
        "33 30 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory",
        "34 30 0:30 /nested /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids",
        "40 25 0:40 / /proc rw - proc proc rw",
    ])  # fmt: skip
    files = container.cgroup_procs_files("/leviath.slice/a.scope", mountinfo)
    assert files == [
        "/sys/fs/cgroup/unified/leviath.slice/a.scope/cgroup.procs",
        "/sys/fs/cgroup/systemd/leviath.slice/a.scope/cgroup.procs",
        "/sys/fs/cgroup/memory/leviath.slice/a.scope/cgroup.procs",
    ]
    assert container.cgroup_procs_files("/nested/x.scope", mountinfo)[-1] == (
        "/sys/fs/cgroup/pids/x.scope/cgroup.procs"
    )


def test_crun_on_hybrid_cgroups_switches_to_runc_and_says_so_when_runc_is_missing() -> None:
    assert engines.choose_runtime("crun", "hybrid", None, {"runc", "crun"}) == ("runc", None)
    runtime, why = engines.choose_runtime("/usr/bin/crun", "hybrid", None, {"crun"})
    assert runtime is None and why is not None and "hybrid" in why
    assert engines.choose_runtime("crun", "v2", None, {"crun"}) == (None, None)
    assert engines.choose_runtime("runc", "hybrid", None, {"runc"}) == (None, None)
    assert engines.choose_runtime("crun", "hybrid", "youki", set()) == ("youki", None)


def test_the_cgroup_mode_is_read_from_the_mount_table() -> None:
    hybrid = ("1 0 0:1 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
              "2 0 0:2 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")  # fmt: skip
    assert engines.cgroup_mode(hybrid) == "hybrid"
    assert engines.cgroup_mode(hybrid.splitlines()[0]) == "v2"
    assert engines.cgroup_mode(hybrid.splitlines()[1]) == "v1"


def test_ulimits_never_ask_above_the_hard_limits_in_force() -> None:
    assert engines.ulimits({"nofile": 20000, "nproc": 96365}, {}) == {
        "nofile": (20000, 20000), "nproc": (96365, 96365),
    }
    assert engines.ulimits({"nofile": -1, "nproc": -1}, {}) == {
        "nofile": (1 << 20, 1 << 20), "nproc": (1 << 20, 1 << 20),
    }
    wanted = engines.parse_ulimits("nofile=1024:99999, nproc=100")
    assert engines.ulimits({"nofile": 4096, "nproc": 500}, wanted) == {
        "nofile": (1024, 4096), "nproc": (100, 100),
    }
    with pytest.raises(ValueError, match="nofile=SOFT:HARD"):
        engines.parse_ulimits("stack=1")
    with pytest.raises(ValueError, match="soft <= hard"):
        engines.parse_ulimits("nofile=10:5")


def test_probe_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c_availability.os, "geteuid", lambda: 1000)
    assert container.probe(eff()) == "the container kind needs the daemon to run as root"
    monkeypatch.setattr(c_availability.os, "geteuid", lambda: 0)
    monkeypatch.setattr(engines, "find_binary", lambda _n: None)
    c_availability._engine_cache.clear()
    reason = container.probe(eff())
    assert reason == "no container engine (podman or docker) on PATH"
    c_availability._engine_cache.clear()


def oci_process(**over: object) -> dict[str, object]:
    process: dict[str, object] = {
        "user": {"uid": 65534, "gid": 65534},
        "args": ["/.leviath-init", "-P"], "env": ["HOSTNAME=x"], "cwd": WORKDIR,
        "capabilities": {}, "noNewPrivileges": True, "consoleSize": {"height": 1, "width": 1},
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
    }  # fmt: skip
    process.update(over)
    return {"process": process}


def test_a_runtime_exec_keeps_the_containers_user_groups_and_limits_with_the_specs_argv() -> None:
    spec = spec_for(eff(), env={"LANG": "C.UTF-8"})
    process = c_worker.runtime_process(oci_process(), spec)
    assert process["args"] == ["sh", "-c", "echo hi"]
    assert process["env"] == [f"{k}={v}" for k, v in spec.env.items()]
    assert "HOSTNAME=x" not in process["env"]
    assert process["cwd"] == WORKDIR and process["terminal"] is False
    assert process["user"] == {"uid": 1000, "gid": 1000, "additionalGids": [27, 990]}
    assert process["capabilities"] == {} and process["noNewPrivileges"] is True
    assert process["rlimits"] == [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]
    assert "consoleSize" not in process


def test_a_runtime_exec_refuses_a_container_that_is_not_the_users_or_keeps_privileges() -> None:
    spec = spec_for(eff())
    with pytest.raises(Unavailable, match="init does not run as set up"):
        c_worker.runtime_process(oci_process(user={"uid": 1000, "gid": 1000}), spec)
    with pytest.raises(Unavailable, match="capabilities"):
        c_worker.runtime_process(oci_process(capabilities={"bounding": ["CAP_KILL"]}), spec)
    with pytest.raises(Unavailable, match="privileges"):
        c_worker.runtime_process(oci_process(noNewPrivileges=False), spec)


def test_only_podman_with_runc_or_crun_takes_the_runtime_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = spec_for(eff())
    docker = c_records.Record(engine=DOCKER, container_id="c" * 64)
    assert c_worker.runtime_exec(docker, spec) is None
    odd = c_records.Record(engine=PODMAN, container_id="c" * 64, runtime_path="/usr/bin/kata")
    assert c_worker.runtime_exec(odd, spec) is None
    monkeypatch.setenv(c_worker.EXEC_ENV, "engine")
    runc = c_records.Record(engine=PODMAN, container_id="c" * 64, runtime_path="/usr/sbin/runc")
    assert c_worker.runtime_exec(runc, spec) is None


# Seen on Debian 13 (tests/vm/): with a default MemoryMax for every agent the
# engine was always given --memory, and crun could not open memory.max below
# the agent's scope (pure cgroup v2: the scope holds processes, so its children
# never get the memory or pids controller): no container agent started.
def test_limits_a_pure_v2_parent_cannot_take_are_left_to_the_scope() -> None:
    opts = ["--read-only", "--pids-limit", "771", "--memory", "512", "--memory-swap", "512",
            "--cpus", "0.50", "--user", "1:1"]  # fmt: skip
    assert c_cgroups.limits_the_parent_can_take(opts, "") == ["--read-only", "--user", "1:1"]
    assert c_cgroups.limits_the_parent_can_take(opts, "cpu pids\n") == [
        "--read-only", "--pids-limit", "771", "--cpus", "0.50", "--user", "1:1"]
    assert c_cgroups.limits_the_parent_can_take(opts, "cpu memory pids") == opts


def test_on_v1_and_hybrid_hosts_the_engine_keeps_every_limit() -> None:
    opts = ["--pids-limit", "771", "--memory", "512", "--memory-swap", "512"]
    assert c_cgroups.limits_the_parent_can_take(opts, None) == opts


def test_runtime_state_reads_what_inspect_would_give(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record of a container just started comes from the OCI runtime's
    state (issue 18: one engine call less); anything unexpected means None,
    and then the engine's `inspect` is asked."""
    monkeypatch.setattr(c_start, "RUNTIME_STATE_ROOT", str(tmp_path))
    cid = "ab" * 32
    bundle = f"/var/lib/containers/storage/overlay-containers/{cid}/userdata"
    (tmp_path / "runc" / cid).mkdir(parents=True)
    state = {"id": cid, "init_process_pid": 4242,
             "config": {"labels": ["io.container.manager=libpod", f"bundle={bundle}"]}}  # fmt: skip
    (tmp_path / "runc" / cid / "state.json").write_text(json.dumps(state))
    eng = engines.DetectedEngine("podman", "/usr/bin/podman", None, default_runtime="runc")
    assert c_start._runtime_state(eng, f"{cid}\n") == {
        "State": {"Pid": 4242}, "Id": cid, "OCIRuntime": "runc",
        "OCIConfigPath": f"{bundle}/config.json",
    }  # fmt: skip
    assert c_start._runtime_state(eng, "not an id\n") is None
    assert c_start._runtime_state(DOCKER, f"{cid}\n") is None
    assert c_start._runtime_state(engines.DetectedEngine("podman", "/p", None), f"{cid}\n") is None
    for bad in ({**state, "id": "cd" * 32}, {**state, "init_process_pid": 0},
                {**state, "config": {"labels": ["bundle=relative"]}}):  # fmt: skip
        (tmp_path / "runc" / cid / "state.json").write_text(json.dumps(bad))
        assert c_start._runtime_state(eng, cid) is None
    (tmp_path / "crun" / cid).mkdir(parents=True)
    crun_status = {"id": cid, "pid": 7, "bundle": bundle}
    (tmp_path / "crun" / cid / "status").write_text(json.dumps(crun_status))
    crun = engines.DetectedEngine("podman", "/usr/bin/podman", "crun")
    assert c_start._runtime_state(crun, cid) == {
        "State": {"Pid": 7}, "Id": cid, "OCIRuntime": "crun",
        "OCIConfigPath": f"{bundle}/config.json",
    }  # fmt: skip
