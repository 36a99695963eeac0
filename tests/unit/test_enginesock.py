"""The filtered engine socket's pure parts: the `[sandbox.containers]` merge,
the bind view and the request rules (the bed's tests/integration/
test_engine_socket.py drives them from inside real agents)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from leviathd.config.load import parse_blueprint, parse_config
from leviathd.config.merge import resolve
from leviathd.config.models import Publish
from leviathd.enginesock import rules
from leviathd.enginesock.view import BindRefused, View, _Entry

MACHINE = """[sandbox.containers]
enabled = true
cap_add = ["SYS_PTRACE", "cap_net_admin"]
publish = "any"
"""


def test_only_the_machine_grants_and_lower_layers_only_tighten() -> None:
    nothing = resolve(parse_config("", "m"), None, None, "a").agent.containers
    assert not nothing.enabled and nothing.cap_add == () and nothing.publish == Publish.LOOPBACK
    user_asks = parse_config("[sandbox.containers]\nenabled = true\npublish = 'any'\n", "u")
    got = resolve(parse_config("", "m"), user_asks, None, "a")
    assert not got.agent.containers.enabled
    assert "containers-not-granted" in [f.code for f in got.findings]
    machine = parse_config(MACHINE, "m")
    assert resolve(machine, None, None, "a").agent.containers.cap_add == ("SYS_PTRACE",
                                                                          "NET_ADMIN")
    bp = parse_blueprint(
        '[agent]\nname = "a"\ncommand = ["x"]\n[sandbox.containers]\npublish = "loopback"\n'
        'cap_add = ["SYS_PTRACE", "SYS_ADMIN"]\nsocket = "/run/docker.sock"\n', "bp")
    got = resolve(machine, None, bp, "a")
    c = got.agent.containers
    assert c.enabled and c.publish == Publish.LOOPBACK and c.cap_add == ("SYS_PTRACE",)
    assert c.socket is None
    codes = {f.code for f in got.findings}
    assert {"containers-cap-add-overruled", "containers-socket-ignored"} <= codes
    off = parse_blueprint('[agent]\nname = "a"\ncommand = ["x"]\n[sandbox.containers]\n'
                          'enabled = false\n', "bp")
    assert not resolve(machine, None, off, "a").agent.containers.enabled


def test_cap_all_is_not_a_capability() -> None:
    with pytest.raises(Exception, match="capability"):
        parse_config('[sandbox.containers]\ncap_add = ["ALL"]\n', "m")


def _view(tmp: Path, *, mask: bool = False) -> View:
    work = tmp / "work"
    (work / "sub").mkdir(parents=True)
    (tmp / "ssh").mkdir()
    (tmp / "scratch" / "home").mkdir(parents=True)
    os.symlink(tmp / "ssh", work / "to-ssh")
    os.symlink("/etc", work / "to-etc")
    entries = (
        _Entry("/", "tmpfs", "", False),
        _Entry("/etc", "bind", "/etc", True),
        _Entry("/home/a", "bind", str(tmp / "scratch" / "home"), False),
        _Entry("/home/a/work", "bind", str(work), False),
    )
    masks = (str(work / "sub"),) if mask else ()
    return View(entries, (str(tmp / "ssh"), "/home/a/.ssh"), masks, ())


def test_binds_follow_the_sandbox_view(tmp_path: Path) -> None:
    v = _view(tmp_path)
    assert v.resolve("/home/a/work", True) == (str(tmp_path / "work"), False)
    assert v.resolve("/etc", True) == ("/etc", True)  # read-only stays read-only
    assert v.resolve("/home/a/work/to-etc", True) == ("/etc", True)  # links on the host
    assert v.resolve("/home/a", True)[0] == str(tmp_path / "scratch" / "home")
    for path, says in [("/home/a/.ssh", "hides"), ("/home/a/work/to-ssh", "hides"),
                       ("/", "not a folder"), ("/usr", "not a folder"), ("rel", "absolute")]:
        with pytest.raises(BindRefused, match=says):
            v.resolve(path, True)


def test_a_rootless_engine_gets_the_agents_own_path(tmp_path: Path) -> None:
    # The engine runs in the agent's view (issue 43): the host path the check
    # resolved is given back as the agent sees it, links already followed.
    v = _view(tmp_path)
    (tmp_path / "scratch" / "home" / "cache").mkdir()
    assert v.seen_as(v.resolve("/home/a/work/sub", True)[0]) == "/home/a/work/sub"
    assert v.seen_as(v.resolve("/home/a/cache", True)[0]) == "/home/a/cache"
    assert v.seen_as(v.resolve("/home/a/work/to-etc", True)[0]) == "/etc"
    with pytest.raises(BindRefused, match="not in the agent's sandbox"):
        v.seen_as("/usr")


def test_a_bind_that_would_uncover_a_mask_is_refused(tmp_path: Path) -> None:
    v = _view(tmp_path, mask=True)
    # The sandbox covers work/sub: binding work/.. or work itself shows it again.
    with pytest.raises(BindRefused, match="covers"):
        v.resolve("/home/a/work/sub/..", True)


class _Checks:
    agent_id = "aaaa1111"
    cap_add = ("SYS_PTRACE",)
    publish_any = False
    uid = 1000
    gid = 1000
    podman = True
    daemon = "d"
    cgroup_parent = "/leviath.slice/leviath-a-x-aaaa1111.scope"
    rootless = False
    engine_offline = False
    egress_env: tuple[str, ...] = ()
    controllers: frozenset[str] | None = None

    def parent_controllers(self) -> frozenset[str] | None:
        return self.controllers

    async def container(self, ref: str) -> dict[str, Any]:
        if ref == "mine":
            return {"Id": "c" * 64, "Config": {"Labels": {rules.LABEL_AGENT: self.agent_id}}}
        raise rules.Refused("no such container", 404)

    async def network(self, ref: str) -> dict[str, Any]:
        raise rules.Refused("no such network", 404)

    async def volume(self, name: str, *, create: bool) -> dict[str, Any]:
        return {"Name": name}

    async def image(self, ref: str) -> dict[str, Any]:
        return {"Config": {"Labels": {}}}

    async def exec_container(self, exec_id: str) -> dict[str, Any]:
        return await self.container("mine")

    async def bind(self, path: str, writable: bool) -> tuple[str, bool]:
        if path.startswith("/work"):
            return path, not writable
        if path.startswith("/usr"):
            return path, True
        raise rules.Refused("bind refused")


def _decide(method: str, path: str, body: object = None,
            checks: _Checks | None = None) -> rules.Decision:
    target, _, query = path.partition("?")
    raw = None if body is None else json.dumps(body).encode()
    return asyncio.run(rules.decide(method, target, query, raw, checks or _Checks()))


def _refused(method: str, path: str, body: object = None) -> str:
    with pytest.raises(rules.Refused) as info:
        _decide(method, path, body)
    return info.value.message


def test_lists_carry_the_agents_label_whatever_filters_are_asked() -> None:
    d = _decide("GET", "/v1.41/containers/json?all=1&filters="
                + '{"label":{"org.leviath.engine-agent=other":true}}')
    assert d.target.startswith("/v1.41/containers/json?")
    from urllib.parse import parse_qs, urlsplit
    filters = json.loads(parse_qs(urlsplit(d.target).query)["filters"][0])
    assert filters["label"] == ["org.leviath.engine-agent=other",
                                "org.leviath.engine-agent=aaaa1111"]


def test_create_is_labelled_and_rewritten() -> None:
    d = _decide("POST", "/containers/create", {
        "Image": "x", "Labels": {"a": "b"},
        "HostConfig": {"Binds": ["/usr:/u:rw"], "CapAdd": ["CAP_SYS_PTRACE"],
                       "PortBindings": {"80/tcp": [{"HostPort": "8080"}]}}})
    assert d.body is not None
    body = json.loads(d.body)
    assert body["Labels"][rules.LABEL_AGENT] == "aaaa1111"
    assert body["HostConfig"]["PortBindings"]["80/tcp"][0]["HostIp"] == "127.0.0.1"


def test_writable_host_folders_mean_the_agents_user_and_no_new_privileges() -> None:
    d = _decide("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"Binds": ["/work:/w", "/usr:/u:rw"]}})
    assert d.body is not None
    body = json.loads(d.body)
    assert body["User"] == "1000:1000"
    assert "no-new-privileges" in body["HostConfig"]["SecurityOpt"]
    assert body["HostConfig"]["Binds"] == ["/work:/w:rw,nosuid,nodev",
                                           "/usr:/u:ro,nosuid,nodev"]
    assert "--cap-add is not allowed" in _refused("POST", "/containers/create", {
        "HostConfig": {"Binds": ["/work:/w"], "CapAdd": ["SYS_PTRACE"]}})


@pytest.mark.parametrize(("body", "says"), [
    ({"HostConfig": {"Binds": ["/work:/w:Z"]}}, "bind option 'Z'"),
    ({"HostConfig": {"Binds": ["/work:/w:U"]}}, "bind option 'U'"),
    ({"HostConfig": {"VolumesFrom": ["mine:rw"]}}, "volumes-from"),
    ({"HostConfig": {"VolumesFrom": ["theirs"]}}, "no such container"),
    ({"HostConfig": {"NetworkMode": "container:theirs"}}, "no such container"),
    ({"HostConfig": {"PidMode": "container:theirs"}}, "no such container"),
    ({"HostConfig": {"Runtime": "kata"}}, "--runtime"),
    ({"HostConfig": {"MaskedPaths": []}}, "systempaths=unconfined"),
    ({"HostConfig": {"ReadonlyPaths": []}}, "systempaths=unconfined"),
    ({"HostConfig": {"Privileged": True}}, "privileged containers"),
    ({"HostConfig": {"Privileged": 1}}, "HostConfig.Privileged is not true or false"),
    # Go refuses it; so does the model
    ({"HostConfig": {"Privileged": "false"}}, "HostConfig.Privileged is not true or false"),
    ({"HostConfig": {"Binds": ["/work:/w"], "GroupAdd": ["0"]}}, "--group-add"),
    ({"HostConfig": {"Devices": [{"PathOnHost": "/dev/sda", "PathInContainer": "/dev/sda",
                                  "CgroupPermissions": "rwm"}]}}, "devices"),
    ({"HostConfig": {"DeviceCgroupRules": ["b *:* rwm"]}}, "devices"),
    ({"HostConfig": {"Annotations": {"run.oci.keep_original_groups": "1"}}}, "annotations"),
    ({"HostConfig": {"VolumeDriver": "nfs"}}, "volume drivers"),
    ({"HostConfig": {"SecurityOpt": ["label=disable"]}}, "--security-opt"),
    ({"HostConfig": {"CapAdd": ["ALL"]}}, "--cap-add ALL"),
    ({"HostConfig": {"PublishAllPorts": True}}, "-P binds every port"),
    ({"HostConfig": {"DeviceRequests": [{"Count": -1}]}}, "GPUs"),
    ({"HostConfig": {"CgroupnsMode": "host"}}, "--cgroupns=host"),
    ({"HostConfig": {"Mounts": [{"Type": "volume", "Source": "v", "Target": "/v",
                                 "VolumeOptions": {"DriverConfig": {"Name": "local"}}}]}},
     "volume driver options"),
    ({"Labels": {"org.leviath.engine-agent": "other"}}, "reserved"),
])
def test_create_refusals(body: dict[str, Any], says: str) -> None:
    assert says in _refused("POST", "/containers/create", {"Image": "x", **body})


def test_other_endpoints() -> None:
    assert "privileged exec" in _refused("POST", "/containers/mine/exec", {"Privileged": True})
    assert _refused("GET", "/containers/theirs/json")
    assert "swarm" in _refused("POST", "/swarm/init")
    assert "libpod" in _refused("GET", "/v4.0.0/libpod/info")
    assert "only bridge" in _refused("POST", "/networks/create", {"Driver": "macvlan"})
    assert "driver options" in _refused("POST", "/volumes/create", {
        "DriverOpts": {"type": "none", "o": "bind", "device": "/root"}})
    assert "--network host" in _refused("POST", "/build?networkmode=host")
    assert "--cgroup-parent" in _refused("POST", "/build?cgroupparent=/")
    for sneaky in ("/images/x/../../containers/theirs/json", "/containers/mine/./json",
                   "/containers//json", "/images/a%2F..%2F..%2Fswarm/json"):
        assert "plain form" in _refused("GET", sneaky)
    assert "only the images it built" in _refused("DELETE", "/images/busybox")
    d = _decide("POST", "/build?t=x")
    assert "labels=" in d.target and "aaaa1111" in d.target
    d = _decide("POST", "/containers/mine/attach?stream=1")
    assert d.upgrade and d.target == "/containers/" + "c" * 64 + "/attach?stream=1"


def test_containers_are_placed_under_the_agents_scope() -> None:
    d = _decide("POST", "/containers/create", {"Image": "x", "HostConfig": {
        "Memory": 1 << 20, "PidsLimit": 5}})
    assert d.body is not None
    host = json.loads(d.body)["HostConfig"]
    assert host["CgroupParent"] == _Checks.cgroup_parent
    assert host["Memory"] == 1 << 20 and host["PidsLimit"] == 5
    assert "--cgroup-parent is not allowed" in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"CgroupParent": "/machine.slice"}})
    # Not placed (the engine cannot): the engine's default, still not the agent's choice.
    unplaced = _Checks()
    unplaced.cgroup_parent = ""
    d = _decide("POST", "/containers/create", {"Image": "x"}, unplaced)
    assert d.body is not None and not json.loads(d.body)["HostConfig"].get("CgroupParent")


def test_limits_the_scope_cannot_pass_on_are_left_to_the_scope() -> None:
    v2 = _Checks()
    v2.controllers = frozenset({"cpu"})
    d = _decide("POST", "/containers/create", {"Image": "x", "HostConfig": {
        "Memory": 1 << 20, "MemorySwap": 1 << 20, "PidsLimit": 5, "NanoCpus": 10**9}}, v2)
    assert d.body is not None
    host = json.loads(d.body)["HostConfig"]
    assert "Memory" not in host and "MemorySwap" not in host and "PidsLimit" not in host
    assert host["NanoCpus"] == 10**9


def test_a_key_the_engine_would_read_as_a_checked_one_is_refused() -> None:
    """Go's encoding/json matches keys to fields whatever their case (and
    'ſ' as 's'): each of these made a privileged container before."""
    for key in ("privileged", "PRIVILEGED", "Privileged".replace("i", "I", 1)):
        assert "spelt 'Privileged'" in _refused(
            "POST", "/containers/create", {"HostConfig": {key: True}})
    assert "spelt 'HostConfig'" in _refused(
        "POST", "/containers/create", {"hoſtConfig": {"Privileged": True}})
    with pytest.raises(rules.Refused, match="given twice"):
        rules._json_body(b'{"HostConfig": {"Privileged": true}, "HostConfig": {}}')
    # A map's keys are data, whatever they spell.
    assert rules._json_body(b'{"Labels": {"privileged": "x"}, "DriverOpts": {"type": "none"}}')


@pytest.mark.parametrize("ref", ["mine:rw,z", "mine:z,rw", "mine:z", "mine:Z", "mine:ro,z",
                                 "mine:RW"])
def test_volumes_from_takes_ro_alone(ref: str) -> None:
    """Podman reads --volumes-from's options as a comma list: `rw` anywhere
    in it makes the source's read-only mounts writable, `z` relabels their
    host files. Only `ro` (or nothing) is passed."""
    assert "--volumes-from" in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"VolumesFrom": [ref]}})


def test_volumes_from_read_only_or_as_they_are_passes() -> None:
    for ref in ("mine", "mine:ro"):
        d = _decide("POST", "/containers/create", {
            "Image": "x", "HostConfig": {"VolumesFrom": [ref]}})
        assert d.body is not None
        assert json.loads(d.body)["HostConfig"]["VolumesFrom"] == [
            "c" * 64 + ref.removeprefix("mine")]


@pytest.mark.parametrize("log", [
    {"Type": "k8s-file", "Config": {"path": "/etc/cron.d/x"}},  # podman writes there as root
    {"Type": "syslog", "Config": {"syslog-address": "tcp://127.0.0.1:25"}},  # host loopback
    {"Type": "splunk", "Config": {"splunk-url": "http://127.0.0.1:8080"}},
    {"Type": "gelf", "Config": {"gelf-address": "udp://10.0.0.1:12201"}},
    {"Type": "fluentd", "Config": {"fluentd-address": "unix:///run/leviathd/x.sock"}},
    {"Type": "json-file", "Config": {"PATH": "/root/x"}},
    {"Type": "fluentd"},  # the host's localhost:24224 by default
    {"Type": "syslog"}, {"Type": "gelf", "Config": {}}, {"Type": "awslogs"},
])
def test_a_log_driver_that_writes_or_connects_as_the_engine_is_refused(
        log: dict[str, Any]) -> None:
    """The engine runs the log driver on the host, as root: a log path is a
    root write anywhere, a log address a connection from the host's own
    network (its loopback) or to any unix socket."""
    assert "--log" in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"LogConfig": log}})
    assert "spelt 'LogConfig'" in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"logConfig": log}})


def test_the_engines_own_log_drivers_pass() -> None:
    for log in ({"Type": "json-file", "Config": {"max-size": "10m", "max-file": "3"}},
                {"Type": "none"}, {"Type": "journald", "Config": {}}, {"Type": "k8s-file"},
                {"Type": "local", "Config": {"compress": "true"}},
                {"Type": "", "Config": None}):
        d = _decide("POST", "/containers/create", {"Image": "x", "HostConfig": {"LogConfig": log}})
        assert d.body is not None


# ------------------------------------------- what mutation testing found open


def _created(body: dict[str, Any], checks: _Checks | None = None) -> dict[str, Any]:
    d = _decide("POST", "/containers/create", {"Image": "x", **body}, checks)
    assert d.body is not None and d.mutating
    return dict(json.loads(d.body))


@pytest.mark.parametrize("cap", ["SYS_ADMIN", "cap_sys_admin", " Sys_Module ", "all"])
def test_only_the_machines_capabilities_are_added(cap: str) -> None:
    assert "--cap-add" in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"CapAdd": [cap]}})
    assert _created({"HostConfig": {"CapAdd": ["cap_sys_ptrace"]}})["HostConfig"]["CapAdd"]


@pytest.mark.parametrize("name", ["kernel.core_pattern", "kernel.modprobe", "vm.overcommit_memory",
                                  "kernel.shm_rmid_forced_x", "fs.protected_symlinks"])
def test_a_sysctl_of_the_whole_host_is_refused(name: str) -> None:
    assert "--sysctl" in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"Sysctls": {name: "|/tmp/x"}}})


def test_per_container_sysctls_pass() -> None:
    sysctls = {"net.ipv4.ip_unprivileged_port_start": "0", "kernel.shmmax": "1",
               "fs.mqueue.msg_max": "10"}
    assert _created({"HostConfig": {"Sysctls": sysctls}})["HostConfig"]["Sysctls"] == sysctls


@pytest.mark.parametrize(("key", "mode"), [("UsernsMode", "keep-id"), ("UsernsMode", "auto"),
                                           ("Cgroup", "private"), ("PidMode", "ns:/proc/1/ns/pid"),
                                           ("IpcMode", "/proc/1/ns/ipc")])
def test_namespaces_other_than_the_containers_own_are_refused(key: str, mode: str) -> None:
    assert "is not allowed" in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {key: mode}})


def test_the_containers_own_namespaces_pass() -> None:
    host = {"PidMode": "private", "IpcMode": "shareable", "UTSMode": "private",
            "CgroupnsMode": "private", "PidMode2": None}
    host.pop("PidMode2")
    assert _created({"HostConfig": host})["HostConfig"]["IpcMode"] == "shareable"
    got = _created({"HostConfig": {"PidMode": "container:mine"}})["HostConfig"]
    assert got["PidMode"] == "container:" + "c" * 64


def test_oom_score_adj_below_zero_is_refused_and_zero_passes() -> None:
    assert "--oom-score-adj" in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"OomScoreAdj": -1}})
    for value in (0, 1, 1000):
        got = _created({"HostConfig": {"OomScoreAdj": value}})
        assert got["HostConfig"]["OomScoreAdj"] == value


def test_links_are_rewritten_to_the_own_containers_name() -> None:
    class Named(_Checks):
        async def container(self, ref: str) -> dict[str, Any]:
            return {**await super().container(ref), "Name": "/mine-1"}

    got = _created({"HostConfig": {"Links": ["mine:db", "mine"]}}, Named())["HostConfig"]
    assert got["Links"] == ["mine-1:db", "mine-1:mine"]
    assert "no such container" in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"Links": ["theirs:db"]}})


@pytest.mark.parametrize("mode", ["othernet", "ns:/proc/1/ns/net", "/proc/1/ns/net",
                                  "slirp4netns:allow_host_loopback=true",
                                  "pasta:--map-host-loopback,10.0.2.2", "bridge:ip=1.2.3.4"])
def test_a_network_not_the_agents_is_refused(mode: str) -> None:
    says = "no such network" if mode == "othernet" else f"--network {mode} is not allowed"
    assert says in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"NetworkMode": mode}})


@pytest.mark.parametrize(("name", "says"), [("host", "--network host is not allowed"),
                                            ("othernet", "no such network")])
def test_an_endpoint_on_a_network_not_the_agents_is_refused(name: str, says: str) -> None:
    assert says in _refused("POST", "/containers/create", {
        "Image": "x", "NetworkingConfig": {"EndpointsConfig": {name: {}}}})


def test_endpoints_on_the_default_networks_pass() -> None:
    for name in ("bridge", "podman", "none", "default"):
        assert _created({"NetworkingConfig": {"EndpointsConfig": {name: {}}}})


@pytest.mark.parametrize("opt", ["no-new-privileges:false", "no-new-privileges=0",
                                 "no-new-privileges:xtrue", "seccomp=unconfined", "seccomp=",
                                 "apparmor=unconfined", "label=disable", "unmask=ALL"])
def test_security_options_other_than_no_new_privileges_are_refused(opt: str) -> None:
    assert "--security-opt" in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"SecurityOpt": [opt]}})


def test_no_new_privileges_passes() -> None:
    opts = ["no-new-privileges", "no-new-privileges:true", "no-new-privileges=true"]
    assert _created({"HostConfig": {"SecurityOpt": opts}})["HostConfig"]["SecurityOpt"] == opts


@pytest.mark.parametrize("bind", ["/work", "/work:/w:ro:z", "/work:/w:rw:x:y", "vol:/w:rw:Z"])
def test_a_bind_not_source_target_options_is_refused(bind: str) -> None:
    assert "SOURCE:TARGET" in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"Binds": [bind]}})


def test_a_bind_given_in_mounts_is_checked_as_a_bind() -> None:
    for source in ("/root", "/etc/shadow", ""):
        assert "bind refused" in _refused("POST", "/containers/create", {
            "Image": "x", "HostConfig": {"Mounts": [{"Type": "bind", "Source": source,
                                                     "Target": "/x"}]}})
    got = _created({"HostConfig": {"Mounts": [
        {"Type": "bind", "Source": "/work/a", "Target": "/a", "ReadOnly": True},
        {"Type": "bind", "Source": "/usr", "Target": "/u"},
        {"Type": "tmpfs", "Target": "/t"}]}})
    host = got["HostConfig"]
    # As bind strings: the engine gets the checked host path and nosuid, nodev;
    # tmpfs as HostConfig.Tmpfs; Mounts itself never reaches the engine.
    assert host["Binds"] == ["/work/a:/a:ro,nosuid,nodev", "/usr:/u:ro,nosuid,nodev"]
    assert host["Tmpfs"] == {"/t": ""} and "Mounts" not in host
    assert "User" not in got  # nothing writable


def test_a_writable_bind_in_mounts_makes_the_agents_user() -> None:
    got = _created({"HostConfig": {"Mounts": [{"Type": "bind", "Source": "/work/a",
                                               "Target": "/a"}]}})
    assert got["User"] == "1000:1000"
    assert got["HostConfig"]["Binds"] == ["/work/a:/a:rw,nosuid,nodev"]
    assert "no-new-privileges" in got["HostConfig"]["SecurityOpt"]
    assert "runs as your user" in _refused("POST", "/containers/create", {
        "Image": "x", "User": "0", "HostConfig": {"Mounts": [
            {"Type": "bind", "Source": "/work/a", "Target": "/a"}]}})


class _RootlessChecks(_Checks):
    rootless = True


def test_on_the_users_rootless_engine_writable_folders_mean_container_root() -> None:
    # Rootless, container root is the agent's user on the host; its uid 1000
    # would be a subordinate id (issue 29 part A, carried into part B's model).
    c = _RootlessChecks()
    d = _decide("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"Binds": ["/work:/w"]}}, c)
    assert d.body is not None
    body = json.loads(d.body)
    assert body["User"] == "0:0" and body["Labels"][rules.LABEL_USER] == "0:0"
    assert "no-new-privileges" in body["HostConfig"]["SecurityOpt"]
    with pytest.raises(rules.Refused, match="runs as your user: --user 0:0"):
        _decide("POST", "/containers/create", {
            "Image": "x", "User": "1:1", "HostConfig": {"Binds": ["/work:/w"]}}, c)


@pytest.mark.parametrize("bopts", [{"Propagation": "rshared"}, {"Propagation": "shared"},
                                   {"NonRecursive": True}, {"ReadOnlyNonRecursive": True}])
def test_bind_options_that_reach_past_the_bind_are_refused(bopts: dict[str, Any]) -> None:
    assert "not allowed" in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"Mounts": [{"Type": "bind", "Source": "/usr",
                                                 "Target": "/u", "BindOptions": bopts}]}})


@pytest.mark.parametrize("kind", ["glob", "image", "devpts", "npipe", "cluster", "BIND", ""])
def test_mount_types_other_than_bind_volume_tmpfs_are_refused(kind: str) -> None:
    mount = {"Type": kind, "Source": "/root/*", "Target": "/x"}
    says = "not a plain name" if kind == "" else f"mounts of type {kind}"
    if kind == "":  # no type: a volume named by Source, which is no volume name
        class NoVolume(_Checks):
            async def volume(self, name: str, *, create: bool) -> dict[str, Any]:
                raise rules.Refused("bind refused", 400)
        with pytest.raises(rules.Refused, match=says):
            _decide("POST", "/containers/create",
                    {"Image": "x", "HostConfig": {"Mounts": [mount]}}, NoVolume())
        return
    assert says in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"Mounts": [mount]}})


def test_volumes_from_a_container_with_writable_folders_makes_the_agents_user() -> None:
    class Writable(_Checks):
        async def container(self, ref: str) -> dict[str, Any]:
            if ref == "rw-one":
                return {"Id": "d" * 64, "Config": {"Labels": {
                    rules.LABEL_AGENT: self.agent_id, rules.LABEL_USER: "1000:1000"}}}
            return await super().container(ref)

    got = _created({"HostConfig": {"VolumesFrom": ["rw-one"]}}, Writable())
    assert got["User"] == "1000:1000" and got["HostConfig"]["VolumesFrom"] == ["d" * 64]
    assert "no-new-privileges" in got["HostConfig"]["SecurityOpt"]
    assert "User" not in _created({"HostConfig": {"VolumesFrom": ["mine"]}}, Writable())


@pytest.mark.parametrize("path", ["/swarm", "/secrets", "/configs", "/plugins", "/nodes",
                                  "/tasks", "/services", "/session", "/grpc", "/system/df",
                                  "/auth", "/commit"])
def test_a_get_of_an_unknown_or_machine_wide_endpoint_is_refused(path: str) -> None:
    assert _refused("GET", path)
    assert _refused("POST", path)


def test_the_read_only_basics_pass_and_writes_to_them_do_not() -> None:
    for path in ("/_ping", "/version", "/info", "/v1.41/_ping"):
        assert _decide("GET", path).target == path
        assert _decide("HEAD", path).target == path
    assert _refused("POST", "/info")
    ev = _decide("GET", "/events?since=1")
    assert "aaaa1111" in ev.target and not ev.upgrade


def test_exec_start_alone_is_a_stream() -> None:
    start = _decide("POST", "/exec/abc/start", {"Tty": False})
    assert start.upgrade and start.mutating
    for method, path in (("GET", "/exec/abc/json"), ("POST", "/exec/abc/resize?h=1&w=1")):
        d = _decide(method, path)
        assert not d.upgrade and not d.mutating and d.target == path
    for method, path in (("POST", "/exec/abc/json"), ("GET", "/exec/abc/resize"),
                         ("GET", "/exec/abc/start"), ("DELETE", "/exec/abc/json")):
        assert _refused(method, path)


def test_only_attach_and_exec_start_are_streams() -> None:
    """A decision with `upgrade` relays the client's bytes to the engine raw
    after the request: on any other endpoint, a second request written after
    the first would reach the engine unfiltered."""
    for method, path, body in (
            ("GET", "/containers/json", None), ("GET", "/_ping", None),
            ("POST", "/containers/create", {"Image": "x"}), ("GET", "/containers/mine/json", None),
            ("POST", "/containers/mine/start", None), ("GET", "/containers/mine/logs", None),
            ("POST", "/containers/mine/exec", {"Cmd": ["true"]}), ("GET", "/events", None),
            ("GET", "/networks", None), ("GET", "/volumes", None), ("POST", "/build", None),
            ("GET", "/images/json", None), ("POST", "/images/create?fromImage=x", None)):
        d = _decide(method, path, body)
        assert not d.upgrade, (method, path)
    assert _decide("POST", "/containers/mine/attach?stream=1").upgrade


def test_the_json_bodies_the_rules_read_are_read_whole() -> None:
    for method, path in (("POST", "/containers/create"), ("POST", "/v1.41/containers/create"),
                         ("POST", "/containers/x/exec"), ("POST", "/networks/create"),
                         ("POST", "/networks/n/connect"), ("POST", "/volumes/create"),
                         ("POST", "/exec/e/start")):
        assert rules.wants_json_body(method, path), path
    for method, path in (("GET", "/containers/create"), ("POST", "/build"),
                         ("POST", "/images/load"), ("PUT", "/containers/x/archive"),
                         ("GET", "/containers/x/exec")):
        assert not rules.wants_json_body(method, path), path


def test_creates_and_removals_are_audited_as_changes() -> None:
    assert _decide("POST", "/containers/create", {"Image": "x"}).mutating
    assert _decide("DELETE", "/containers/mine").mutating
    assert not _decide("GET", "/containers/json").mutating


def test_a_detached_exec_start_is_no_stream() -> None:
    d = _decide("POST", "/exec/abc/start", {"Detach": True})
    assert not d.upgrade and d.body == b'{"Detach":true}'
    assert _decide("POST", "/exec/abc/start", {"Detach": False, "Tty": True}).upgrade
    for key in ("detach", "DETACH"):
        assert "spelt 'Detach'" in _refused("POST", "/exec/abc/start", {key: True})
    with pytest.raises(rules.Refused, match="given twice"):
        asyncio.run(rules.decide("POST", "/exec/abc/start", "",
                                 b'{"Detach": false, "Detach": true}', _Checks()))


def test_the_view_is_made_from_the_sandboxs_own_table(tmp_path: Path) -> None:
    """View.from_spec: what the sandbox covers inside a bind (a mask) stays
    covered; a bind of the folder around it would show it again."""
    from leviathd.sandbox.spec import Mount
    work = tmp_path / "work"
    (work / "secret").mkdir(parents=True)
    (work / "src").mkdir()
    spec = SimpleNamespace(mounts=(
        Mount("tmpfs", "/"), Mount("bind", "/home/a/work", str(work)),
        Mount("mask", "/home/a/work/secret")), hidden=())
    v = View.from_spec(spec)  # type: ignore[arg-type]
    assert v.masks == (str(work / "secret"),)
    assert v.resolve("/home/a/work/src", True) == (str(work / "src"), False)
    for path in ("/home/a/work", "/home/a/work/secret", "/home/a/work/src/.."):
        with pytest.raises(BindRefused, match="covers"):
            v.resolve(path, True)


def test_a_later_mount_at_the_same_place_is_what_the_sandbox_shows(tmp_path: Path) -> None:
    (tmp_path / "covered").mkdir()
    v = View((_Entry("/", "tmpfs", "", False),
              _Entry("/home/a/data", "bind", str(tmp_path / "covered"), False),
              _Entry("/home/a/data", "tmpfs", "", False)), (), (), ())
    with pytest.raises(BindRefused, match="not a folder"):
        v.resolve("/home/a/data", True)


def test_a_link_into_a_read_only_part_of_a_writable_bind_stays_read_only(tmp_path: Path) -> None:
    """The sandbox binds data rw and data/ro read-only over it; a link the
    agent makes in data to data/ro resolves on the host to data/ro."""
    data = tmp_path / "data"
    (data / "ro").mkdir(parents=True)
    os.symlink(data / "ro", data / "to-ro")
    v = View((_Entry("/", "tmpfs", "", False),
              _Entry("/home/a/data", "bind", str(data), False),
              _Entry("/home/a/data/ro", "bind", str(data / "ro"), True)), (), (), ())
    assert v.resolve("/home/a/data/to-ro", True) == (str(data / "ro"), True)
    assert v.resolve("/home/a/data", True) == (str(data), False)


def test_a_folder_around_or_inside_the_agents_sockets_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "sock" / "inner").mkdir(parents=True)
    v = View((_Entry("/", "tmpfs", "", False), _Entry("/r", "bind", str(run), False)), (), (),
             (str(run / "sock"),))
    for path in ("/r", "/r/sock", "/r/sock/inner"):
        with pytest.raises(BindRefused, match="own sockets"):
            v.resolve(path, True)


def test_a_folder_holding_a_hidden_one_is_refused(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "keys").mkdir(parents=True)
    (work / "src").mkdir()
    v = View((_Entry("/", "tmpfs", "", False), _Entry("/w", "bind", str(work), False)),
             (str(work / "keys"),), (), ())
    with pytest.raises(BindRefused, match="hides"):
        v.resolve("/w", True)
    assert v.resolve("/w/src", True) == (str(work / "src"), False)


# ------------------------------------------------ routing: what each endpoint may do

OWN_NET = {"Id": "n" * 64, "Labels": {rules.LABEL_AGENT: "aaaa1111"}}
OWN_IMAGE = {"Config": {"Labels": {rules.LABEL_AGENT: "aaaa1111"}}}


class _Owner(_Checks):
    """The agent owns the network `mine-net`, the image `mine-img` and the
    container `rw-one`, which has writable host folders (runs as 1000:1000)."""

    async def network(self, ref: str) -> dict[str, Any]:
        if ref == "mine-net":
            return dict(OWN_NET)
        return await super().network(ref)

    async def image(self, ref: str) -> dict[str, Any]:
        return dict(OWN_IMAGE) if ref == "mine-img" else await super().image(ref)

    async def container(self, ref: str) -> dict[str, Any]:
        if ref == "rw-one":
            return {"Id": "d" * 64, "Config": {"Labels": {
                rules.LABEL_AGENT: self.agent_id, rules.LABEL_USER: "1000:1000"}}}
        return await super().container(ref)


def _own(method: str, path: str, body: object = None) -> rules.Decision:
    return _decide(method, path, body, _Owner())


def _own_refused(method: str, path: str, body: object = None) -> str:
    with pytest.raises(rules.Refused) as info:
        _own(method, path, body)
    return info.value.message


def test_container_endpoints_route_by_method_and_operation() -> None:
    cid = "c" * 64
    assert _own("GET", "/containers/mine/json").target == f"/containers/{cid}/json"
    d = _own("DELETE", "/containers/mine?force=1")
    assert d.target == f"/containers/{cid}?force=1" and d.mutating
    for method, path in (("GET", "/containers/mine"), ("POST", "/containers/mine"),
                         ("POST", "/containers/mine/json"), ("GET", "/containers/mine/nope"),
                         ("GET", "/containers/mine/start"), ("DELETE", "/containers/mine/json"),
                         ("GET", "/containers/mine/attach"), ("POST", "/containers/mine/update"),
                         ("POST", "/containers/mine/commit"), ("GET", "/containers/mine/export/x")):
        assert _own_refused(method, path), (method, path)
    assert _own("POST", "/containers/mine/start").mutating
    assert not _own("GET", "/containers/mine/logs").mutating


def test_in_a_container_with_writable_folders_execs_run_as_the_agents_user() -> None:
    d = _own("POST", "/containers/rw-one/exec", {"Cmd": ["id"]})
    assert d.body is not None and json.loads(d.body)["User"] == "1000:1000"
    for asked in ("1000", "1000:1000"):
        d = _own("POST", "/containers/rw-one/exec", {"Cmd": ["id"], "User": asked})
        assert d.body is not None and json.loads(d.body)["User"] == "1000:1000"
    for asked in ("0", "root", "0:0", "1000:0"):
        assert "exec runs as" in _own_refused("POST", "/containers/rw-one/exec",
                                              {"Cmd": ["id"], "User": asked})
    d = _own("POST", "/containers/mine/exec", {"Cmd": ["id"], "User": "0"})
    assert d.body is not None and json.loads(d.body)["User"] == "0"


def test_copying_into_a_container_with_writable_folders_is_refused() -> None:
    assert "engine writes as root" in _own_refused("PUT", "/containers/rw-one/archive?path=/")
    for method in ("GET", "HEAD"):
        assert _own(method, "/containers/rw-one/archive?path=/")
    assert _own("PUT", "/containers/mine/archive?path=/").mutating


def test_network_endpoints() -> None:
    nid = "n" * 64
    listed = _own("GET", "/networks?filters={}")
    assert listed.target.startswith("/networks?") and "aaaa1111" in listed.target
    assert _own("POST", "/networks/prune").mutating
    assert "aaaa1111" in _own("POST", "/networks/prune").target
    assert _own("GET", "/networks/mine-net").target == f"/networks/{nid}"
    d = _own("DELETE", "/networks/mine-net")
    assert d.target == f"/networks/{nid}" and d.mutating
    d = _own("POST", "/networks/mine-net/connect", {"Container": "mine"})
    assert d.target == f"/networks/{nid}/connect" and d.mutating
    assert d.body is not None and json.loads(d.body)["Container"] == "c" * 64
    for method, path, body in (
            ("GET", "/networks/theirs", None), ("DELETE", "/networks/theirs", None),
            ("POST", "/networks/theirs/connect", {"Container": "mine"}),
            ("POST", "/networks/mine-net/connect", {"Container": "theirs"}),
            ("POST", "/networks/mine-net/connect", {}),
            ("GET", "/networks/mine-net/connect", None), ("POST", "/networks/mine-net", None),
            ("DELETE", "/networks/mine-net/disconnect", None), ("GET", "/networks/prune", None),
            ("GET", "/networks/create", None), ("PUT", "/networks", None)):
        assert _own_refused(method, path, body), (method, path)
    made = _own("POST", "/networks/create", {"Name": "n1", "Driver": "bridge"})
    assert made.mutating and made.body is not None
    assert json.loads(made.body)["Labels"][rules.LABEL_AGENT] == "aaaa1111"


def test_an_id_only_under_id_names_the_network() -> None:
    class Podman(_Owner):
        async def network(self, ref: str) -> dict[str, Any]:
            return {"ID": "p" * 64, "Labels": {rules.LABEL_AGENT: "aaaa1111"}}
    assert _decide("GET", "/networks/x", None, Podman()).target == "/networks/" + "p" * 64


@pytest.mark.parametrize("extra", [{"ConfigFrom": {"Network": "x"}}, {"ConfigOnly": True},
                                   {"Ingress": True}, {"Scope": "swarm"}, {"Scope": "global"},
                                   {"Driver": "macvlan"}, {"Driver": "host"}])
def test_swarm_config_only_and_host_reaching_networks_are_refused(extra: dict[str, Any]) -> None:
    assert "not allowed" in _own_refused("POST", "/networks/create", {"Name": "n1", **extra})
    for ok in ({"Scope": "local"}, {"Scope": ""}, {"Driver": ""}):
        assert _own("POST", "/networks/create", {"Name": "n1", **ok})


def test_volume_endpoints() -> None:
    assert "aaaa1111" in _own("GET", "/volumes").target
    assert "aaaa1111" in _own("POST", "/volumes/prune").target and _own(
        "POST", "/volumes/prune").mutating
    got = _own("GET", "/volumes/v1")
    assert got.target == "/volumes/v1" and not got.mutating
    assert _own("DELETE", "/volumes/v1").mutating
    for method, path in (("POST", "/volumes/v1"), ("PUT", "/volumes/v1"),
                         ("GET", "/volumes/v1/x"), ("DELETE", "/volumes")):
        assert _own_refused(method, path), (method, path)
    for body in ({}, {"Driver": "local"}, {"Driver": ""}):
        made = _own("POST", "/volumes/create", {"Name": "v", **body})
        assert made.mutating and made.body is not None
        assert json.loads(made.body)["Labels"][rules.LABEL_AGENT] == "aaaa1111"
    for body in ({"Driver": "nfs"}, {"Driver": "rclone"},
                 {"Driver": "local", "DriverOpts": {"o": "bind"}}):
        assert "not allowed" in _own_refused("POST", "/volumes/create", {"Name": "v", **body})


def test_image_endpoints() -> None:
    assert _own("GET", "/images/json").target == "/images/json"
    pull = _own("POST", "/images/create?fromImage=busybox&tag=1")
    assert pull.mutating
    assert _own("POST", "/images/create?fromSrc=-").mutating
    for src in ("http://127.0.0.1:8080/x.tar", "/etc/shadow", "file:///etc"):
        assert "importing" in _own_refused("POST", "/images/create?fromSrc=" + src)
    assert _own("POST", "/images/load").mutating
    for path in ("/images/busybox/json", "/images/busybox/history", "/distribution/busybox/json",
                 "/images/docker.io/library/busybox:1/json"):
        d = _own("GET", path)
        assert d.target == path and not d.mutating
    d = _own("DELETE", "/images/mine-img")
    assert d.mutating and d.target == "/images/mine-img"
    for method, path in (("GET", "/images/busybox/get"), ("GET", "/images/get"),
                         ("POST", "/images/busybox/push"), ("POST", "/images/busybox/tag"),
                         ("GET", "/images/search"), ("POST", "/images/busybox/json"),
                         ("DELETE", "/images/busybox/json"), ("DELETE", "/images/mine-img/history"),
                         ("GET", "/images/load"), ("GET", "/images/create"),
                         ("POST", "/images/mine-img"), ("GET", "/build"),
                         ("POST", "/images/prune"), ("POST", "/commit"),
                         ("POST", "/distribution/busybox/json")):
        assert _own_refused(method, path), (method, path)


def test_a_build_is_labelled_as_the_agents_and_buildkit_is_refused() -> None:
    from urllib.parse import parse_qsl, urlsplit
    d = _own("POST", '/build?t=x&version=1&q=1&labels={"a":"b"}')
    assert d.mutating
    query = parse_qsl(urlsplit(d.target).query)
    assert ("t", "x") in query and ("q", "1") in query
    labels = [json.loads(v) for k, v in query if k == "labels"]
    assert labels == [{"a": "b", rules.LABEL_AGENT: "aaaa1111", rules.LABEL_DAEMON: "d"}]
    for q in ("version=2", "remote=http://x/y.tar", "networkmode=host", "cgroupparent=/x",
              'labels={"org.leviath.engine-agent":"other"}'):
        assert _own_refused("POST", "/build?" + q), q


def test_every_change_is_marked_for_the_audit_and_the_sweeper() -> None:
    for method, path, body in (
            ("POST", "/containers/create", {"Image": "x"}), ("POST", "/containers/prune", None),
            ("DELETE", "/containers/mine", None), ("POST", "/containers/mine/kill", None),
            ("POST", "/containers/mine/exec", {"Cmd": ["true"]}),
            ("POST", "/networks/create", {"Name": "n"}), ("DELETE", "/networks/mine-net", None),
            ("POST", "/networks/mine-net/disconnect", {"Container": "mine"}),
            ("POST", "/volumes/create", {"Name": "v"}), ("DELETE", "/volumes/v", None),
            ("POST", "/images/create?fromImage=x", None), ("POST", "/build", None),
            ("POST", "/images/load", None), ("DELETE", "/images/mine-img", None)):
        assert _own(method, path, body).mutating, (method, path)


@pytest.mark.parametrize("target", ["/t:z", "/t,z", "rel", "", "/t\x00x"])
def test_a_mount_target_that_would_add_bind_options_is_refused(target: str) -> None:
    says = "mount target" if "\0" not in target else "holds a NUL"
    assert says in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"Mounts": [{"Type": "bind", "Source": "/usr",
                                                 "Target": target}]}})


def test_bind_options_that_stay_in_the_bind_pass() -> None:
    got = _created({"HostConfig": {"Mounts": [
        {"Type": "bind", "Source": "/usr", "Target": "/u",
         "BindOptions": {"Propagation": "rprivate", "NonRecursive": False}}]}})
    assert got["HostConfig"]["Binds"] == ["/usr:/u:ro,nosuid,nodev"]


@pytest.mark.parametrize("prefix", ["/v1.23", "/v1.12", "/v1", "/v1.2", "/v0.99"])
def test_api_versions_that_took_a_host_config_at_start_are_refused(prefix: str) -> None:
    """Before API 1.24 Docker applies a HostConfig sent with POST
    /containers/ID/start (Docker 20.10, Debian 12's docker.io, still takes
    it): the start's body is not read by the rules, so privileged or a bind
    of / would reach the engine there."""
    body = {"Privileged": True, "Binds": ["/:/host"]}
    assert "API version" in _refused("POST", f"{prefix}/containers/mine/start", body)
    assert "API version" in _refused("GET", f"{prefix}/_ping")


def test_api_versions_from_1_24_pass() -> None:
    for prefix in ("/v1.24", "/v1.41", "/v1.47", "/v2.0", "/v4.0.0", ""):
        assert _decide("POST", f"{prefix}/containers/mine/start").target == (
            f"{prefix}/containers/{'c' * 64}/start")


def test_every_key_the_rules_read_from_a_request_has_its_other_spellings_refused() -> None:
    """A key the rules read in one spelling, the engine reads in any case:
    each one the source reads must be in _CHECKED_KEYS (a key dropped from
    it, or a new check reading a key not in it, would let `privileged`-style
    spellings through)."""
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(rules))
    read: set[str] = set()
    for node in ast.walk(tree):
        key = None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get" and node.args
                and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        if isinstance(key, str) and key[:1].isupper() and key.isidentifier():
            read.add(key)
        if isinstance(node, ast.For):  # for key, flag in (("PidMode", "--pid"), ...)
            read |= {c.value for c in ast.walk(node.iter) if isinstance(c, ast.Constant)
                     and isinstance(c.value, str) and c.value[:1].isupper()}
    read |= set(rules._LIMIT_CONTROLLERS)
    # What the engine's inspect data carries (not a request's).
    read -= {"Id", "ID", "Name"}
    assert read - rules._CHECKED_KEYS == set()
    for key in ("Privileged", "Binds", "CapAdd", "Scope", "Target", "UsernsMode", "Memory"):
        assert key in read


def test_a_swarm_scope_spelt_otherwise_is_refused() -> None:
    assert "spelt 'Scope'" in _own_refused("POST", "/networks/create",
                                           {"Name": "n", "scope": "swarm"})


def test_a_folder_whose_name_only_begins_like_a_shown_one_is_not_shown(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "database").mkdir()
    os.symlink(tmp_path / "database", data / "l")
    v = View((_Entry("/", "tmpfs", "", False), _Entry("/w", "bind", str(data), False)),
             (), (), ())
    with pytest.raises(BindRefused, match="does not show"):
        v.resolve("/w/l", True)
    with pytest.raises(BindRefused, match="not a folder"):
        v.resolve("/wx", True)


def test_a_bind_at_the_root_maps_below_its_source(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    v = View((_Entry("/", "bind", str(tmp_path), True),), (), (), ())
    assert v.resolve("/sub", True) == (str(tmp_path / "sub"), True)


def test_an_exec_is_looked_up_by_its_own_id() -> None:
    class Execs(_Checks):
        async def exec_container(self, exec_id: str) -> dict[str, Any]:
            if exec_id != "e1":
                raise rules.Refused("no such exec instance", 404)
            return await self.container("mine")
    for method, path in (("POST", "/exec/e1/start"), ("GET", "/exec/e1/json"),
                         ("POST", "/exec/e1/resize")):
        assert _decide(method, path, {} if path.endswith("start") else None, Execs())
        with pytest.raises(rules.Refused, match="no such exec"):
            _decide(method, path.replace("e1", "e2"), None, Execs())


def test_the_allowed_bind_options_and_propagations_pass() -> None:
    for opt in ("ro", "rw", "nocopy", "private", "rprivate", "slave", "rslave", "nosuid",
                "nodev", "noexec", "delegated", "cached", "consistent"):
        assert _created({"HostConfig": {"Binds": [f"/usr:/u:{opt}"]}}), opt
    for prop in ("", "private", "rprivate", "slave", "rslave"):
        assert _created({"HostConfig": {"Mounts": [{"Type": "bind", "Source": "/usr",
                                                    "Target": "/u",
                                                    "BindOptions": {"Propagation": prop}}]}})
    got = _created({"HostConfig": {"Binds": ["/work:/w:ro"]}})
    assert got["HostConfig"]["Binds"] == ["/work:/w:ro,nosuid,nodev"]
    assert "User" not in got  # read-only: nothing to run as the agent's user for


def test_a_network_of_another_container_is_named_by_its_id() -> None:
    got = _created({"HostConfig": {"NetworkMode": "container:mine"}})
    assert got["HostConfig"]["NetworkMode"] == "container:" + "c" * 64


def test_a_path_ending_in_a_dot_segment_is_not_plain() -> None:
    for method, path in (("DELETE", "/images/mine-img/.."), ("GET", "/containers/mine/."),
                         ("GET", "/images/busybox/json/..")):
        assert "plain form" in _own_refused(method, path)
    assert _own_refused("GET", "/distribution/busybox/json/x")


@pytest.mark.parametrize("key", ["PidMode", "IpcMode", "UTSMode", "UsernsMode", "CgroupnsMode",
                                 "Cgroup"])
def test_each_host_namespace_is_refused(key: str) -> None:
    assert "=host is not allowed" in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {key: "host"}})


@pytest.mark.parametrize("host", [
    {"Devices": [{"PathOnHost": "/dev/sda", "PathInContainer": "/dev/sda",
                  "CgroupPermissions": "rwm"}]},
    {"DeviceRequests": [{"Driver": "nvidia", "Count": -1}]},
    {"DeviceCgroupRules": ["c 8:* rwm"]},
])
def test_the_create_check_itself_refuses_devices(host: dict[str, object]) -> None:
    """The model refuses devices first (their only value is the zero); the
    create check refuses them again, so a body that reaches it by another way
    (a model that learns the field) still gets no host device."""
    with pytest.raises(rules.Refused, match="devices"):
        asyncio.run(rules.check_create({"Image": "x", "HostConfig": host}, _Checks()))
