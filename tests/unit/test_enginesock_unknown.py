"""Issue 49, item 2: a field the filtered socket's model does not know is
dropped when its value is a zero (what a newer client sends for a setting
its user did not touch: docker 28's `GwPriority: 0`), and refused with its
name otherwise. From the attacker's side: the body is what an agent could
send on $DOCKER_HOST, and what is checked is the body the engine would get.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_enginesock import _decide
from test_enginesock_rebuild import CLI_RUN

from leviathd.enginesock import model, rules

# Where an unknown field goes: objects of the model in the docker CLI's own
# create body (a new release adds its fields anywhere).
_PLACES: list[tuple[str, ...]] = [
    (), ("HostConfig",), ("HostConfig", "LogConfig"), ("HostConfig", "RestartPolicy"),
    ("NetworkingConfig",), ("NetworkingConfig", "EndpointsConfig", "default"),
    ("Healthcheck",), ("HostConfig", "Mounts", 0), ("HostConfig", "Mounts", 0, "TmpfsOptions"),
    ("HostConfig", "Ulimits", 0),
]

# "Xx" starts no field of the model, in any case (the spelling check would
# refuse a key the engine reads as a known one).
_NAMES = st.from_regex(r"\AXx[A-Za-z0-9]{0,12}\Z")
# Keys inside a value: none the engine could read as a field's spelling.
_KEYS = st.from_regex(r"\Azz[a-z0-9]{0,5}\Z")
_ZERO_LEAF = st.sampled_from([None, False, 0, 0.0, "", [], {}])
_ZEROS = st.recursive(_ZERO_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=3)),
    max_leaves=8)
_ANY = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(_KEYS, inner, max_size=3)),
    max_leaves=8)
_NOT_ZERO = _ANY.filter(lambda v: not model.is_zero(v))


def _base() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(CLI_RUN)
    body["Healthcheck"] = {"Test": ["CMD", "true"], "Interval": 30_000_000_000}
    body["HostConfig"]["Mounts"] = [{"Type": "tmpfs", "Target": "/t",
                                     "TmpfsOptions": {"SizeBytes": 4096}}]
    body["HostConfig"]["Ulimits"] = [{"Name": "nofile", "Soft": 1024, "Hard": 1024}]
    return body


def _with(place: tuple[str, ...], name: str, value: Any) -> dict[str, Any]:
    body = _base()
    at: Any = body
    for step in place:
        at = at[step]
    at[name] = copy.deepcopy(value)
    return body


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def _where(place: tuple[str, ...], name: str) -> str:
    out = ""
    for step in (*place, name):
        if isinstance(step, int):
            out += f"[{step}]"
        elif place[-2:-1] == ("EndpointsConfig",) and step == place[-1]:
            out += f"[{step!r}]"
        else:
            out += f".{step}" if out else step
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(place=st.sampled_from(_PLACES), name=_NAMES, value=_ZEROS)
def test_an_unknown_field_at_its_zero_is_accepted_and_never_forwarded(
        place: tuple[str, ...], name: str, value: Any) -> None:
    d = _decide("POST", "/v1.41/containers/create", _with(place, name, value))
    assert d.body is not None
    assert name not in _keys(json.loads(d.body)), (place, name, value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(place=st.sampled_from(_PLACES), name=_NAMES, value=_NOT_ZERO)
def test_an_unknown_field_with_another_value_is_refused_by_name(
        place: tuple[str, ...], name: str, value: Any) -> None:
    with pytest.raises(rules.Refused) as info:
        _decide("POST", "/v1.41/containers/create", _with(place, name, value))
    assert info.value.status == 400
    assert info.value.message.startswith(_where(place, name) + " is not a field the filtered "
                                         "socket knows"), info.value.message


# `docker run --rm img true` of the docker CLI 28.2.2 (the machine's `docker`),
# as captured at the socket: its EndpointsConfig adds GwPriority.
CLI_28_ENDPOINT = (
    '{"IPAMConfig":null,"Links":null,"Aliases":null,"DriverOpts":null,"GwPriority":0,'
    '"NetworkID":"","EndpointID":"","Gateway":"","IPAddress":"","MacAddress":"",'
    '"IPPrefixLen":0,"IPv6Gateway":"","GlobalIPv6Address":"","GlobalIPv6PrefixLen":0,'
    '"DNSNames":null}')


def test_docker_28s_gw_priority_at_zero_passes_and_another_is_refused() -> None:
    body = json.loads(CLI_RUN)
    body["NetworkingConfig"]["EndpointsConfig"]["default"] = json.loads(CLI_28_ENDPOINT)
    d = _decide("POST", "/v1.41/containers/create", body)
    assert d.body is not None and b"GwPriority" not in d.body
    body["NetworkingConfig"]["EndpointsConfig"]["default"]["GwPriority"] = 10
    with pytest.raises(rules.Refused) as info:
        _decide("POST", "/v1.41/containers/create", body)
    assert "NetworkingConfig.EndpointsConfig['default'].GwPriority is not a field" in \
        info.value.message


@pytest.mark.parametrize(("path", "body", "name"), [
    ("/containers/mine/exec", {"Cmd": ["true"], "XxNew": 0}, "XxNew"),
    ("/networks/create", {"Name": "n", "XxNew": ""}, "XxNew"),
    ("/volumes/create", {"Name": "v", "XxNew": None}, "XxNew"),
    ("/networks/create", {"Name": "n", "XxNew": {"A": [False]}}, "XxNew"),
])
def test_other_bodies_drop_an_unknown_zero_too(path: str, body: dict[str, Any],
                                               name: str) -> None:
    d = _decide("POST", path, body)
    assert d.body is not None and name.encode() not in d.body
    body[name] = 1
    with pytest.raises(rules.Refused):
        _decide("POST", path, body)


# ------------------------------------------------ podman --remote (libpod)


def _label_filter(target: str) -> list[str]:
    from urllib.parse import parse_qs, urlsplit
    return list(json.loads(parse_qs(urlsplit(target).query)["filters"][0])["label"])


def test_podman_remotes_ping_and_lists_pass_with_the_agents_label() -> None:
    assert _decide("GET", "/v4.3.1/libpod/_ping").target == "/v4.3.1/libpod/_ping"
    assert _decide("HEAD", "/v5.4.2/libpod/_ping").target == "/v5.4.2/libpod/_ping"
    assert _decide("GET", "/v5.4.2/libpod/version").target == "/v5.4.2/libpod/version"
    d = _decide("GET", "/v4.3.1/libpod/containers/json?all=false&external=false&filters=%7B%7D"
                "&last=-1&namespace=false&size=false&sync=false")
    assert _label_filter(d.target) == ["org.leviath.engine-agent=aaaa1111"]
    d = _decide("GET", "/v4.3.1/libpod/containers/json?all=true&filters="
                + '{"label":["org.leviath.engine-agent=other"]}')
    assert _label_filter(d.target) == ["org.leviath.engine-agent=other",
                                       "org.leviath.engine-agent=aaaa1111"]
    d = _decide("GET", "/v4.3.1/libpod/images/json?all=false&filters=%7B%7D")
    assert d.target.startswith("/v4.3.1/libpod/images/json?")


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v4.3.1/libpod/containers/create"),
    ("POST", "/v4.3.1/libpod/images/pull?reference=x"),
    ("GET", "/v4.3.1/libpod/containers/json?external=true"),
    ("GET", "/v4.3.1/libpod/info"),
    ("POST", "/v4.3.1/libpod/version"),
    ("GET", "/v4.3.1/libpod/versions"),
    ("POST", "/v4.3.1/libpod/containers/abc/start"),
])
def test_the_rest_of_libpod_is_refused_saying_why(method: str, path: str) -> None:
    with pytest.raises(rules.Refused) as info:
        _decide(method, path, {"image": "x", "privileged": True} if "create" in path else None)
    says = info.value.message
    assert "external" in says or "podman's own API (libpod) is not filtered" in says, says


def test_libpod_is_refused_when_the_engine_is_not_podman() -> None:
    from test_enginesock import _Checks

    class Docker(_Checks):
        podman = False

    with pytest.raises(rules.Refused) as info:
        _decide("GET", "/v4.3.1/libpod/_ping", checks=Docker())
    assert "not podman" in info.value.message


# ------------------------------------------------ logs on Debian 13 (item 6)


def test_a_container_without_a_log_driver_gets_podmans_file_driver() -> None:
    d = _decide("POST", "/v1.41/containers/create", json.loads(CLI_RUN))
    assert d.body is not None
    assert json.loads(d.body)["HostConfig"]["LogConfig"]["Type"] == "k8s-file"
    body = json.loads(CLI_RUN)
    body["HostConfig"]["LogConfig"] = {"Type": "json-file", "Config": {"max-size": "1m"}}
    d = _decide("POST", "/v1.41/containers/create", body)
    assert d.body is not None
    assert json.loads(d.body)["HostConfig"]["LogConfig"] == body["HostConfig"]["LogConfig"]


# ------------------------------- an engine without a network (rootless, offline)


def _offline() -> Any:
    from test_enginesock import _Checks

    class Offline(_Checks):
        rootless = True
        engine_offline = True
        egress_env: tuple[str, ...] = ()

        async def network(self, ref: str) -> dict[str, Any]:
            return {"Id": "n" * 64, "Labels": {rules.LABEL_AGENT: self.agent_id}}

    return Offline()


def test_on_an_offline_engine_the_default_network_becomes_none() -> None:
    body = json.loads(CLI_RUN)
    body["NetworkingConfig"]["EndpointsConfig"]["default"] = json.loads(CLI_28_ENDPOINT)
    d = _decide("POST", "/v1.41/containers/create", body, checks=_offline())
    assert d.body is not None
    got = json.loads(d.body)
    assert got["HostConfig"]["NetworkMode"] == "none" and "NetworkingConfig" not in got
    # An engine with the host's network keeps the default as asked.
    d = _decide("POST", "/v1.41/containers/create", json.loads(CLI_RUN))
    assert d.body is not None
    assert json.loads(d.body)["HostConfig"]["NetworkMode"] == "default"


@pytest.mark.parametrize(("host", "endpoints", "says"), [
    ({"PortBindings": {"80/tcp": [{"HostPort": "8080"}]}}, None, "publishing a port"),
    ({"NetworkMode": "stack_default"}, {"stack_default": {}}, "network stack_default cannot"),
    ({}, {"mynet": {}}, "network mynet cannot"),
])
def test_on_an_offline_engine_what_needs_a_network_is_refused_saying_why(
        host: dict[str, Any], endpoints: dict[str, Any] | None, says: str) -> None:
    body: dict[str, Any] = {"Image": "x", "HostConfig": host}
    if endpoints is not None:
        body["NetworkingConfig"] = {"EndpointsConfig": endpoints}
    with pytest.raises(rules.Refused) as info:
        _decide("POST", "/v1.41/containers/create", body, checks=_offline())
    assert says in info.value.message and "[sandbox] network" in info.value.message, \
        info.value.message


def test_on_an_offline_engine_a_builds_run_steps_get_no_network() -> None:
    from urllib.parse import parse_qs, urlsplit
    for query in ("", "&networkmode=default", "&networkmode=bridge"):
        d = _decide("POST", f"/v1.41/build?t=a{query}", checks=_offline())
        assert parse_qs(urlsplit(d.target).query)["networkmode"] == ["none"], d.target


# ------------------------- behind the proxy: the agent's own network namespace

EGRESS = ("HTTPS_PROXY=http://127.0.0.1:3128", "HTTP_PROXY=http://127.0.0.1:3128",
          "http_proxy=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128")


def _behind_proxy() -> Any:
    checks = _offline()
    checks.egress_env = EGRESS
    return checks


@pytest.mark.parametrize("mode", ["", "default", "bridge", "slirp4netns", "pasta"])
def test_behind_the_proxy_a_container_shares_the_agents_network_and_gets_its_proxy(
        mode: str) -> None:
    body = json.loads(CLI_RUN)
    body["HostConfig"]["NetworkMode"] = mode
    body["Env"] = ["http_proxy=", "KEEP=1"]
    d = _decide("POST", "/v1.41/containers/create", body, checks=_behind_proxy())
    assert d.body is not None
    got = json.loads(d.body)
    # The engine's host network is the agent's own namespace (only lo).
    assert got["HostConfig"]["NetworkMode"] == "host" and "NetworkingConfig" not in got
    # The user's own (empty) http_proxy is hers; the rest are the agent's.
    assert got["Env"] == ["http_proxy=", "KEEP=1", *(e for e in EGRESS
                                                     if not e.startswith("http_proxy="))]


@pytest.mark.parametrize(("host", "endpoints", "says"), [
    ({"PortBindings": {"80/tcp": [{"HostPort": "8080"}]}}, None, "publishing a port"),
    ({"PublishAllPorts": True}, None, "publishing a port"),
    ({"NetworkMode": "stack_default"}, {"stack_default": {}}, "network stack_default cannot"),
    ({"NetworkMode": "host"}, None, "--network host is not allowed"),
    ({"NetworkMode": "slirp4netns:allow_host_loopback=true"}, None, "is not allowed"),
    ({"Sysctls": {"net.ipv4.ip_unprivileged_port_start": "0"}}, None, "net.* sysctls"),
])
def test_behind_the_proxy_what_would_change_the_agents_network_is_refused(
        host: dict[str, Any], endpoints: dict[str, Any] | None, says: str) -> None:
    body: dict[str, Any] = {"Image": "x", "HostConfig": host}
    if endpoints is not None:
        body["NetworkingConfig"] = {"EndpointsConfig": endpoints}
    with pytest.raises(rules.Refused) as info:
        _decide("POST", "/v1.41/containers/create", body, checks=_behind_proxy())
    assert says in info.value.message, info.value.message


def test_behind_the_proxy_none_and_another_containers_network_stay_as_asked() -> None:
    for mode in ("none", "container:mine"):
        d = _decide("POST", "/v1.41/containers/create",
                    {"Image": "x", "HostConfig": {"NetworkMode": mode}}, checks=_behind_proxy())
        assert d.body is not None
        got = json.loads(d.body)
        assert got["HostConfig"]["NetworkMode"].split(":")[0] == mode.split(":")[0]
        assert not any(str(e).startswith("HTTP_PROXY=") for e in got.get("Env") or [])


def test_behind_the_proxy_a_builds_run_steps_get_the_agents_network_and_proxy() -> None:
    from urllib.parse import parse_qs, urlsplit
    for query in ("", "&networkmode=default", "&buildargs=%7B%22http_proxy%22%3A%22%22%7D"):
        d = _decide("POST", f"/v1.41/build?t=a{query}", checks=_behind_proxy())
        got = parse_qs(urlsplit(d.target).query)
        assert got["networkmode"] == ["host"], d.target
        args = json.loads(got["buildargs"][0])
        # The user's own value is kept; Docker's predefined names only.
        assert args["HTTP_PROXY"] == "http://127.0.0.1:3128", args
        assert args["http_proxy"] == ("" if "buildargs" in query else "http://127.0.0.1:3128")
        assert "ALL_PROXY" not in args
    # --network none asked for stays none, with nothing added.
    d = _decide("POST", "/v1.41/build?t=a&networkmode=none", checks=_behind_proxy())
    got = parse_qs(urlsplit(d.target).query)
    assert got["networkmode"] == ["none"] and "buildargs" not in got, d.target
