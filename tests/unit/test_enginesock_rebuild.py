"""Issue 29, part B: the filtered engine socket is an allow-list that
rebuilds requests. From the attacker's side: each request is what an agent
could send on $DOCKER_HOST, and what is checked is the exact bytes the engine
receives (a real AgentProxy in front of a recording stand-in engine on a unix
socket: the engine's own behaviour is the bed's, tests/integration/
test_engine_rebuild.py)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_enginesock import _Checks, _decide, _refused

from leviathd.enginesock import bodies, model, proxy, rules, wire
from leviathd.enginesock.view import View, _Entry


def _created(body: dict[str, Any]) -> dict[str, Any]:
    d = _decide("POST", "/containers/create", {"Image": "x", **body})
    assert d.body is not None
    return dict(json.loads(d.body))


# ------------------------------------------------------- break 1: Config.Volumes


@pytest.mark.parametrize("key", ["/:/host", "/etc:/e:rw", "/x,src=bobvol", "rel", "/a\0b"])
def test_a_volumes_key_that_podman_would_read_as_a_bind_is_refused(key: str) -> None:
    # Podman's compat layer made {"/:/host": {}} a writable bind of the host's root.
    says = _refused("POST", "/containers/create", {"Image": "x", "Volumes": {key: {}}})
    assert "mount target" in says or "NUL" in says, says


def test_an_anonymous_volume_passes_as_a_plain_target() -> None:
    got = _created({"Volumes": {"/data": {}}})
    assert got["Volumes"] == {"/data": {}}


# --------------------------------------------- break 3: volume Mounts' Target


@pytest.mark.parametrize("mount", [
    {"Type": "volume", "Source": "v", "Target": "/v,src=bobvol"},
    {"Type": "volume", "Source": "v", "Target": "/v,volume-opt=o=bind,volume-opt=device=/root"},
    {"Type": "volume", "Source": "v,dst=/x", "Target": "/v"},
    {"Type": "volume", "Source": "../bob", "Target": "/v"},
    {"Type": "volume", "Source": "v", "Target": "/v", "VolumeOptions": {"Subpath": "../../"}},
])
def test_a_volume_mount_cannot_smuggle_mount_options(mount: dict[str, Any]) -> None:
    says = _refused("POST", "/containers/create", {"Image": "x", "HostConfig": {
        "Mounts": [mount]}})
    assert "mount target" in says or "plain name" in says or "Subpath" in says, says


def test_volume_mounts_reach_the_engine_as_checked_bind_strings() -> None:
    got = _created({"HostConfig": {"Mounts": [
        {"Type": "volume", "Source": "cache", "Target": "/c", "ReadOnly": True,
         "VolumeOptions": {"NoCopy": True}},
        {"Type": "volume", "Target": "/anon"},
        {"Type": "tmpfs", "Target": "/t", "TmpfsOptions": {"SizeBytes": 1024, "Mode": 0o1777}}]}})
    host = got["HostConfig"]
    assert host["Binds"] == ["cache:/c:ro,nocopy"]
    assert host["Tmpfs"] == {"/t": "size=1024,mode=1777"}
    assert got["Volumes"] == {"/anon": {}}
    assert "Mounts" not in host


# ------------------------------------------- unknown fields, the model's types


@pytest.mark.parametrize(("body", "field"), [
    ({"HostConfig": {"Mounts": [{"Type": "bind", "Source": "/usr", "Target": "/u",
                                 "Propagation": "shared"}]}}, "HostConfig.Mounts[0].Propagation"),
    ({"HostConfig": {"CgroupnsMode": "private", "NewEngineField": True}},
     "HostConfig.NewEngineField"),
    ({"Spec": {"process": {"args": ["sh"]}}}, "Spec"),
    ({"HostConfig": {"LogConfig": {"Type": "json-file", "Path": "/etc/x"}}},
     "HostConfig.LogConfig.Path"),
])
def test_a_field_the_model_does_not_know_is_refused_by_name(body: dict[str, Any],
                                                           field: str) -> None:
    with pytest.raises(rules.Refused) as info:
        _decide("POST", "/containers/create", {"Image": "x", **body})
    assert info.value.status == 400
    assert info.value.message.startswith(field + " is not a field"), info.value.message


@pytest.mark.parametrize(("body", "field"), [
    ({"HostConfig": {"OomKillDisable": True}}, "HostConfig.OomKillDisable"),
    ({"HostConfig": {"ContainerIDFile": "/etc/passwd"}}, "HostConfig.ContainerIDFile"),
    ({"HostConfig": {"StorageOpt": {"size": "1G"}}}, "HostConfig.StorageOpt"),
    ({"HostConfig": {"BlkioWeightDevice": [{"Path": "/dev/sda", "Weight": 10}]}},
     "HostConfig.BlkioWeightDevice"),
    ({"NetworkingConfig": {"EndpointsConfig": {"bridge": {"DriverOpts": {"a": "b"}}}}},
     "NetworkingConfig.EndpointsConfig['bridge'].DriverOpts"),
])
def test_a_field_whose_only_allowed_value_is_zero_is_refused_otherwise(
        body: dict[str, Any], field: str) -> None:
    assert _refused("POST", "/containers/create", {"Image": "x", **body}).startswith(
        field + " is not allowed")


def test_what_the_docker_cli_sends_passes_and_zero_fields_are_left_out() -> None:
    # `docker run --rm img true` of the docker CLI 26 (as captured).
    cli = json.loads(CLI_RUN)
    got = _created(cli)
    host = got["HostConfig"]
    for gone in ("Devices", "BlkioWeightDevice", "ContainerIDFile", "CpuCount", "Isolation",
                 "OomKillDisable", "DeviceRequests", "Mounts"):
        assert gone not in host, gone
    assert got["Cmd"] == ["true"] and host["AutoRemove"] is True
    assert host["CgroupParent"] == _Checks.cgroup_parent


# ------------------------------------------------ "Also": ports, healthchecks


@pytest.mark.parametrize("port", ["22", "80", "1-2000", "0080", "1023"])
def test_a_host_port_below_1024_is_refused(port: str) -> None:
    assert "below 1024" in _refused("POST", "/containers/create", {
        "Image": "x", "HostConfig": {"PortBindings": {"80/tcp": [{"HostPort": port}]}}})


def test_a_host_port_above_1024_or_chosen_by_the_engine_passes() -> None:
    got = _created({"HostConfig": {"PortBindings": {"80/tcp": [{"HostPort": "8080"},
                                                               {"HostPort": ""}]}}})
    assert got["HostConfig"]["PortBindings"]["80/tcp"] == [
        {"HostPort": "8080", "HostIp": "127.0.0.1"}, {"HostPort": "", "HostIp": "127.0.0.1"}]


def test_a_healthcheck_interval_is_raised_to_the_floor() -> None:
    got = _created({"Healthcheck": {"Test": ["CMD", "true"], "Interval": 1_000_000_000,
                                    "StartInterval": 1}})
    assert got["Healthcheck"]["Interval"] == rules.MIN_HEALTH_INTERVAL_NS
    assert got["Healthcheck"]["StartInterval"] == rules.MIN_HEALTH_INTERVAL_NS


def test_an_images_own_fast_healthcheck_is_raised_to_the_floor_too() -> None:
    class FastImage(_Checks):
        async def image(self, ref: str) -> dict[str, Any]:
            return {"Config": {"Healthcheck": {"Test": ["CMD", "true"],
                                               "Interval": 1_000_000_000}}}
    d = _decide("POST", "/containers/create", {"Image": "x"}, FastImage())
    assert d.body is not None
    assert json.loads(d.body)["Healthcheck"] == {"Test": ["CMD", "true"],
                                                 "Interval": rules.MIN_HEALTH_INTERVAL_NS}


# --------------------------------------------- break 5 and "Also": query strings


@pytest.mark.parametrize("param", [
    "secrets=../../../../etc/shadow", "nsoptions=[{\"Name\":\"pid\",\"Host\":true}]",
    "addcaps=CAP_SYS_ADMIN", "securityopt=seccomp=unconfined", "devices=/dev/sda",
    "volume=/:/host", "isolation=chroot", 'ulimits=[{"Name":"nofile","Hard":1}]',
    "cgroupparent=/", "outputs=type=local,dest=/",
    "dockerfile=/etc/shadow", "dockerfile=../../x", "version=2", "networkmode=host",
])
def test_a_build_parameter_outside_the_list_never_reaches_the_engine(param: str) -> None:
    with pytest.raises(rules.Refused):
        _decide("POST", f"/build?t=x&{param}")


def test_a_build_query_is_serialised_anew() -> None:
    d = _decide("POST", "/v1.41/build?t=a%2Fb%3A1&dockerfile=sub%2FDockerfile&buildargs="
                "%7B%22A%22%3A%221%22%7D&rm=1&target=base")
    assert d.target == ("/v1.41/build?t=a%2Fb%3A1&dockerfile=sub%2FDockerfile&buildargs=%7B%22A"
                        "%22%3A+%221%22%7D&rm=1&target=base&labels=%7B%22org.leviath.engine-agent"
                        "%22%3A+%22aaaa1111%22%2C+%22org.leviath.engine-daemon%22%3A+%22d%22%7D")


def test_the_docker_clis_legacy_build_query_passes() -> None:
    # `DOCKER_BUILDKIT=0 docker build -t me/x:1 --build-arg A=1 --label l=v ctx` (CLI 26).
    d = _decide("POST", "/v1.41/build?buildargs=%7B%22A%22%3A%221%22%7D&cachefrom=%5B%5D&"
                "cgroupparent=&cpuperiod=0&cpuquota=0&cpusetcpus=&cpusetmems=&cpushares=0&"
                "dockerfile=Dockerfile&labels=%7B%22l%22%3A%22v%22%7D&memory=0&memswap=0&"
                "networkmode=default&rm=1&shmsize=0&t=me%2Fx%3A1&target=&ulimits=%5B%5D&"
                "version=1")
    assert d.mutating and "t=me%2Fx%3A1" in d.target


def test_force_never_reaches_the_engine_on_an_image_delete() -> None:
    class OwnImage(_Checks):
        async def image(self, ref: str) -> dict[str, Any]:
            return {"Config": {"Labels": {rules.LABEL_AGENT: self.agent_id}}}
    d = _decide("DELETE", "/images/mine?force=1&noprune=1", None, OwnImage())
    assert d.target == "/images/mine?noprune=1"


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/containers/json?all=1&extra=1"), ("POST", "/containers/create?name=x&pod=p"),
    ("DELETE", "/containers/mine?link=1"), ("GET", "/containers/mine/logs?stdout=1&x=y"),
    ("GET", "/containers/mine/top?ps_args=$(id)"), ("POST", "/images/create?fromSrc=/etc"),
    ("GET", "/events?filters=1&x=1"), ("GET", "/_ping?a=b"),
])
def test_an_unknown_query_parameter_is_refused(method: str, path: str) -> None:
    with pytest.raises(rules.Refused):
        _decide(method, path)


# --------------------------------------------------------- break 2: the head


@pytest.mark.parametrize("head", [
    b"GET /_ping HTTP/1.1\r\nX-A: 1\nPOST /libpod/containers/create HTTP/1.1\r\n\r\n",
    b"GET /_ping HTTP/1.1\r\nX-A: a\rb\r\n\r\n",
    b"GET /_ping HTTP/1.1\r\nX-A: a\0b\r\n\r\n",
    b"GET /_ping\nPOST /x HTTP/1.1\r\n\r\n",
    b"GET /_ping HTTP/1.1\r\nX A: b\r\n\r\n",
    b"GET /_ping HTTP/1.1\r\n X-A: b\r\n\r\n",
    b"GET /a\x7fb HTTP/1.1\r\n\r\n",
    b"GET /_ping HTTP/1.1\r\nX-A: caf\xe9\r\n\r\n",
])
def test_a_head_with_a_stray_cr_lf_or_nul_is_refused(head: bytes) -> None:
    with pytest.raises(wire.BadRequest):
        wire.parse_head(head)


# -------------------------------------- the bytes the engine receives (proxy)


class _Engine:
    """A stand-in engine on a unix socket that records each request whole
    and answers 201 to creates, 404 to anything else."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.got: list[bytes] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            writer.close()
            return
        head = wire.parse_head(raw)
        try:
            body = await wire.read_body(reader, head, 1 << 20)
        except (asyncio.IncompleteReadError, wire.BadRequest):
            self.got.append(raw + b"<cut>")  # the proxy closed it mid-body
            writer.close()
            return
        self.got.append(raw + body)
        if head.path.endswith("/containers/create"):
            reply = b'{"Id":"' + b"e" * 64 + b'"}'
            writer.write(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(reply) + reply)
        else:
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()


async def _through_proxy(tmp: Path, *raws: bytes,
                         upload_max: int = 1 << 30) -> tuple[list[bytes], list[bytes]]:
    engine = _Engine(str(tmp / "engine.sock"))
    server = await asyncio.start_unix_server(engine.serve, path=engine.path)
    folder = tmp / "agent"
    folder.mkdir(mode=0o700)
    settings = proxy.Settings(agent_id="aaaa1111", uid=os.getuid(), gid=os.getgid(),
                              cap_add=(), publish_any=False, engine=engine.path, podman=True,
                              daemon="d", cgroup="", upload_max=upload_max)
    view = View((_Entry("/", "tmpfs", "", False),), (), (), ())
    p = proxy.AgentProxy(settings, view, lambda cgroup: "aaaa1111")
    await p.start(str(folder))
    replies = []
    try:
        for raw in raws:
            reader, writer = await asyncio.open_unix_connection(str(folder / proxy.SOCKET_NAME))
            writer.write(raw)
            await writer.drain()
            replies.append(await reader.read())
            writer.close()
    finally:
        await p.close()
        server.close()
    return replies, engine.got


def _proxy(tmp: Path, raw: bytes) -> tuple[bytes, list[bytes]]:
    replies, got = asyncio.run(_through_proxy(tmp, raw))
    return replies[0], got


@pytest.mark.timeout(60)  # today's proxy forwarded the smuggled request and waited on it
def test_a_bare_lf_in_a_header_never_reaches_the_engine(tmp_path: Path) -> None:
    smuggled = (b"GET /_ping HTTP/1.1\r\nHost: x\r\nX-A: 1\n\nPOST /v1.41/libpod/containers/"
                b"create HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
    reply, got = _proxy(tmp_path, smuggled)
    assert reply.startswith(b"HTTP/1.1 400 ") and b"leviathd: a CR, LF or NUL" in reply, reply
    assert got == []


@pytest.mark.timeout(60)
def test_the_engine_receives_a_new_head_and_body_not_the_agents(tmp_path: Path) -> None:
    body = (b'{"Image":"x","Cmd":["true"],"HostConfig":{"Binds":null,"Devices":[],'
            b'"Privileged":false}}')
    raw = (b"POST /v1.41/containers/create?name=c1 HTTP/1.1\r\nHost: evil\r\n"
           b"User-Agent: x\r\nX-Forwarded-For: 1.2.3.4\r\nContent-Type: application/json\r\n"
           b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    reply, got = _proxy(tmp_path, raw)
    assert reply.startswith(b"HTTP/1.1 201 "), reply
    create = [g for g in got if b"/containers/create" in g]
    want_body = (b'{"Image":"x","Cmd":["true"],"HostConfig":{"Privileged":false,'
                 b'"LogConfig":{"Type":"k8s-file"}},'
                 b'"Labels":{"org.leviath.engine-agent":"aaaa1111",'
                 b'"org.leviath.engine-daemon":"d"}}')
    assert create == [b"POST /v1.41/containers/create?name=c1 HTTP/1.1\r\n"
                      b"Content-Type: application/json\r\nHost: docker\r\nConnection: close\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(want_body) + want_body]


# --------------------------------------------------- the model, as a property

_FIELDS = sorted(model.field_names(bodies.CREATE))
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40),
                     st.text(max_size=12), st.sampled_from(["/x", "/a:/b", "v", "/etc"]))


def _json(depth: int = 3) -> st.SearchStrategy[Any]:
    keys = st.one_of(st.sampled_from(_FIELDS), st.text(max_size=8))
    return st.recursive(_SCALARS, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)), max_leaves=24)


def _within(value: Any, spec: model.Spec, where: str) -> None:
    """Raises AssertionError when `value` has a field outside `spec`."""
    if spec.kind == "obj":
        assert isinstance(value, dict), where
        for k, v in value.items():
            assert k in spec.fields, f"{where}.{k}"
            _within(v, spec.fields[k], f"{where}.{k}")
    elif spec.kind in ("list", "strs"):
        assert isinstance(value, list) and spec.item is not None, where
        for v in value:
            _within(v, spec.item, where + "[]")
    elif spec.kind == "map":
        assert isinstance(value, dict) and spec.item is not None, where
        for v in value.values():
            _within(v, spec.item, where + "{}")
    elif spec.kind == "str":
        assert isinstance(value, str), where
    elif spec.kind == "int":
        assert type(value) is int, where
    elif spec.kind == "bool":
        assert type(value) is bool, where
    else:
        raise AssertionError(f"{where}: a zero field reached the engine")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(top=st.dictionaries(st.sampled_from(_FIELDS), _json(), max_size=6),
       host=st.dictionaries(st.sampled_from(sorted(bodies.HOST_CONFIG.fields)), _json(),
                            max_size=6))
def test_random_bodies_never_give_the_engine_a_field_outside_the_model(
        top: dict[str, Any], host: dict[str, Any]) -> None:
    body = {"Image": "x", **top, "HostConfig": host}
    try:
        d = _decide("POST", "/containers/create", body)
    except rules.Refused:
        return
    assert d.body is not None
    _within(json.loads(d.body), bodies.CREATE, "")


@pytest.mark.timeout(60)
def test_the_recording_engine_is_a_real_unix_socket(tmp_path: Path) -> None:
    # The proxy tests above would pass vacuously if nothing were forwarded:
    # a plain allowed request must reach the stand-in engine.
    reply, got = _proxy(tmp_path, b"GET /v1.41/version HTTP/1.1\r\nHost: x\r\n\r\n")
    assert got == [b"GET /v1.41/version HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n"]
    assert reply.startswith(b"HTTP/1.1 404 ")


CLI_RUN = (
    '{"Hostname":"","Domainname":"","User":"","AttachStdin":false,"AttachStdout":true,'
    '"AttachStderr":true,"Tty":false,"OpenStdin":false,"StdinOnce":false,"Env":null,'
    '"Cmd":["true"],"Image":"img","Volumes":{},"WorkingDir":"","Entrypoint":null,'
    '"OnBuild":null,"Labels":{},"HostConfig":{"Binds":null,"ContainerIDFile":"",'
    '"LogConfig":{"Type":"","Config":{}},"NetworkMode":"default","PortBindings":{},'
    '"RestartPolicy":{"Name":"no","MaximumRetryCount":0},"AutoRemove":true,"VolumeDriver":"",'
    '"VolumesFrom":null,"ConsoleSize":[0,0],"CapAdd":null,"CapDrop":null,"CgroupnsMode":"",'
    '"Dns":[],"DnsOptions":[],"DnsSearch":[],"ExtraHosts":null,"GroupAdd":null,"IpcMode":"",'
    '"Cgroup":"","Links":null,"OomScoreAdj":0,"PidMode":"","Privileged":false,'
    '"PublishAllPorts":false,"ReadonlyRootfs":false,"SecurityOpt":null,"UTSMode":"",'
    '"UsernsMode":"","ShmSize":0,"Isolation":"","CpuShares":0,"Memory":0,"NanoCpus":0,'
    '"CgroupParent":"","BlkioWeight":0,"BlkioWeightDevice":[],"BlkioDeviceReadBps":[],'
    '"BlkioDeviceWriteBps":[],"BlkioDeviceReadIOps":[],"BlkioDeviceWriteIOps":[],"CpuPeriod":0,'
    '"CpuQuota":0,"CpuRealtimePeriod":0,"CpuRealtimeRuntime":0,"CpusetCpus":"","CpusetMems":"",'
    '"Devices":[],"DeviceCgroupRules":null,"DeviceRequests":null,"MemoryReservation":0,'
    '"MemorySwap":0,"MemorySwappiness":-1,"OomKillDisable":false,"PidsLimit":0,"Ulimits":[],'
    '"CpuCount":0,"CpuPercent":0,"IOMaximumIOps":0,"IOMaximumBandwidth":0,"MaskedPaths":null,'
    '"ReadonlyPaths":null},"NetworkingConfig":{"EndpointsConfig":{"default":{"IPAMConfig":null,'
    '"Links":null,"Aliases":null,"MacAddress":"","NetworkID":"","EndpointID":"","Gateway":"",'
    '"IPAddress":"","IPPrefixLen":0,"IPv6Gateway":"","GlobalIPv6Address":"",'
    '"GlobalIPv6PrefixLen":0,"DriverOpts":null,"DNSNames":null}}}}'
)


# ------------------------------------------------ break 7: binds by descriptor


def test_a_checked_path_whose_folder_became_a_link_is_not_pinned(tmp_path: Path) -> None:
    from leviathd.enginesock import pins
    (tmp_path / "d").mkdir()
    (tmp_path / "secret").mkdir()
    checked = str(tmp_path / "d")
    fd = pins.open_checked(checked, os.getuid(), os.getgid())
    os.close(fd)
    # The swap after the check: the checked folder is now a link elsewhere.
    (tmp_path / "d").rename(tmp_path / "d.old")
    (tmp_path / "d").symlink_to(tmp_path / "secret")
    with pytest.raises(pins.PinError, match="link"):
        pins.open_checked(checked, os.getuid(), os.getgid())
    # A folder on the way swapped: the descriptor's own path is not the checked one.
    (tmp_path / "d").unlink()
    (tmp_path / "d.old").rename(tmp_path / "d")
    (tmp_path / "d" / "in").mkdir()
    (tmp_path / "d").rename(tmp_path / "d.old")
    (tmp_path / "d").symlink_to(tmp_path / "d.old")
    with pytest.raises(pins.PinError, match="changed after the check"):
        pins.open_checked(str(tmp_path / "d" / "in"), os.getuid(), os.getgid())


# ------------------------------------------- "Also": uploads bounded, charged


def _upload(body: bytes, *, chunked: bool = False) -> bytes:
    head = b"POST /v1.41/build?t=up HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-tar\r\n"
    if chunked:
        half = len(body) // 2
        return (head + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % half
                + body[:half] + b"\r\n" + b"%x\r\n" % (len(body) - half) + body[half:]
                + b"\r\n0\r\n\r\n")
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


@pytest.mark.timeout(60)
def test_an_upload_over_the_agents_budget_is_refused_before_the_engine_has_it(
        tmp_path: Path) -> None:
    replies, got = asyncio.run(_through_proxy(tmp_path, _upload(b"x" * 600),
                                              _upload(b"y" * 600), upload_max=1000))
    assert replies[0].startswith(b"HTTP/1.1 404 "), replies  # passed: the engine's answer
    assert replies[1].startswith(b"HTTP/1.1 413 ") and b"upload_max" in replies[1], replies
    # The second never reached the engine: 400 of 1000 bytes were left.
    assert len(got) == 1 and got[0].endswith(b"x" * 600), got


@pytest.mark.timeout(60)
def test_a_chunked_upload_is_cut_off_at_the_budget(tmp_path: Path) -> None:
    replies, got = asyncio.run(_through_proxy(tmp_path, _upload(b"z" * 3000, chunked=True),
                                              upload_max=2000))
    assert replies[0].startswith(b"HTTP/1.1 413 "), replies
    assert len(got) == 1 and got[0].endswith(b"<cut>") and b"z" * 1501 not in got[0], got


def test_upload_max_is_the_machines_and_a_user_only_lowers_it() -> None:
    from leviathd.config.load import parse_config
    from leviathd.config.merge import UPLOAD_MAX_DEFAULT, resolve
    machine = parse_config("[sandbox.containers]\nenabled = true\nupload_max = '1G'\n", "m")
    assert resolve(machine, None, None, "a").agent.containers.upload_max == 1 << 30
    raise_it = parse_config("[sandbox.containers]\nupload_max = '8G'\n", "u")
    got = resolve(machine, raise_it, None, "a")
    assert got.agent.containers.upload_max == 1 << 30
    assert "containers-upload-max-overruled" in [f.code for f in got.findings]
    lower = parse_config("[sandbox.containers]\nupload_max = '10M'\n", "u")
    assert resolve(machine, lower, None, "a").agent.containers.upload_max == 10 << 20
    unset = parse_config("[sandbox.containers]\nenabled = true\n", "m")
    assert resolve(unset, None, None, "a").agent.containers.upload_max == UPLOAD_MAX_DEFAULT


def test_upload_max_cannot_be_infinity() -> None:
    from leviathd.config.load import parse_config
    with pytest.raises(Exception, match="infinity"):
        parse_config("[sandbox.containers]\nupload_max = 'infinity'\n", "m")


def test_the_docker_clis_network_volume_and_connect_bodies_pass() -> None:
    # As the docker CLI 26 sends them (captured): `network create n1`,
    # `volume create --label x=y v2`, `network connect --alias a1 NET mine`.
    from test_enginesock import _own
    d = _own("POST", "/v1.41/networks/create", json.loads(
        '{"CheckDuplicate":true,"Driver":"bridge","Scope":"","EnableIPv6":false,"IPAM":'
        '{"Driver":"default","Options":{},"Config":[]},"Internal":false,"Attachable":false,'
        '"Ingress":false,"ConfigOnly":false,"ConfigFrom":null,"Options":{},"Labels":{},'
        '"Name":"n1"}'))
    assert d.body is not None and json.loads(d.body)["Name"] == "n1"
    d = _own("POST", "/v1.41/volumes/create",
             {"Driver": "local", "Labels": {"x": "y"}, "Name": "v2"})
    assert d.body is not None and json.loads(d.body)["Labels"]["x"] == "y"
    d = _own("POST", "/v1.41/networks/mine-net/connect", json.loads(
        '{"Container":"mine","EndpointConfig":{"IPAMConfig":{},"Links":null,"Aliases":["a1"],'
        '"MacAddress":"","NetworkID":"","EndpointID":"","Gateway":"","IPAddress":"",'
        '"IPPrefixLen":0,"IPv6Gateway":"","GlobalIPv6Address":"","GlobalIPv6PrefixLen":0,'
        '"DriverOpts":{},"DNSNames":null}}'))
    assert d.body is not None
    assert json.loads(d.body) == {"Container": "c" * 64, "EndpointConfig": {"Aliases": ["a1"]}}


@pytest.mark.parametrize(("path", "body", "says"), [
    ("/networks/create", {"Name": "n", "Options": {"com.docker.network.bridge.name": "eth0"}},
     "Options is not allowed"),
    ("/networks/create", {"Name": "n", "IPAM": {"Driver": "dhcp"}}, "IPAM drivers"),
    ("/volumes/create", {"Name": "../../x"}, "plain name"),
    ("/volumes/create", {"Name": "v", "DriverOpts": {"device": "/root", "o": "bind"}},
     "driver options"),
    ("/networks/mine-net/connect", {"Container": "mine", "EndpointConfig": {
        "Aliases": ["a,b"]}}, "plain name"),
    ("/networks/mine-net/connect", {"Container": "mine", "EndpointConfig": {
        "IPAddress": "10.0.0.5"}}, "IPAddress is not allowed"),
])
def test_network_and_volume_bodies_outside_the_model_are_refused(
        path: str, body: dict[str, Any], says: str) -> None:
    from test_enginesock import _own_refused
    assert says in _own_refused("POST", path, body)


def test_the_docker_clis_exec_body_passes() -> None:
    # `docker exec cp-1 cat /tmp/in.txt` of the docker CLI 26: its ExecOptions
    # has no omitempty, so Detach (false) comes with every exec create. Seen
    # refused from inside an agent (test_engine_rootless.py's docker exec).
    from test_enginesock import _own
    d = _own("POST", "/v1.41/containers/mine/exec", json.loads(
        '{"User":"","Privileged":false,"Tty":false,"ConsoleSize":[0,0],"AttachStdin":false,'
        '"AttachStderr":true,"AttachStdout":true,"Detach":false,"DetachKeys":"","Env":null,'
        '"WorkingDir":"","Cmd":["cat","/tmp/in.txt"]}'))
    assert d.body is not None
    assert json.loads(d.body)["Cmd"] == ["cat", "/tmp/in.txt"]


@pytest.mark.timeout(60)
def test_a_head_with_both_a_length_and_chunked_never_reaches_the_engine(
        tmp_path: Path) -> None:
    """Issue 50: a head that frames its body two ways (Content-Length and
    Transfer-Encoding: chunked) is the classic smuggling shape: the proxy and
    the engine could each end the body at a different byte. The agent sends
    one, with a second request hidden where the length would end the first:
    a 400 from the proxy, and nothing reaches the engine (seen failing with
    the double framing accepted)."""
    hidden = b"POST /v1.41/containers/create HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
    raw = (b"POST /v1.41/build?t=up HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-tar\r\n"
           b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"0\r\n\r\n" + hidden)
    reply, got = _proxy(tmp_path, raw)
    assert reply.startswith(b"HTTP/1.1 400 "), reply
    assert got == [], got
