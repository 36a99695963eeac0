"""Issue 29, part B, from inside real agents in the bed: the filtered engine
socket rebuilds each request from its model, so the outside round's requests
that took host root through the rootful engine (Config.Volumes binds, a
bare LF smuggling a second request, volume mounts whose Target carried
podman's mount options, /build's podman parameters) are refused with a
`leviathd:` error and leave nothing in the engine. Raw requests on
$DOCKER_HOST (test_engine_socket.py's client, and RAW below for bytes that
http.client would not send). The docker CLI's build and cp are
test_engine_socket_cli.py's."""

from __future__ import annotations

import base64
import json
import time

import pytest
from podman_list import podman
from test_engine_socket import BED_HOST_CONFIG, IMAGE, _create, agent, bed  # noqa: F401
from testbed import Testbed

pytestmark = pytest.mark.testbed

# Runs inside the agent: each argument is base64 of raw request bytes (or
# @FILE: the bytes of that file, for what is over an argument's size), sent
# alone on a new connection; prints one JSON line per request: the reply.
RAW = r'''
import base64, json, os, socket, sys
host = os.environ["DOCKER_HOST"].removeprefix("unix://")
for arg in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(host)
    data = open(arg[1:], "rb").read() if arg.startswith("@") else base64.b64decode(arg)
    try:
        s.sendall(data)
    except OSError:
        pass  # refused before the whole body was read: the reply is queued all the same
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except socket.timeout:
        got += b"<timeout>"
    s.close()
    print(json.dumps(got.decode("latin-1")), flush=True)
'''


@pytest.fixture(scope="module")
def raw_bed(bed: Testbed) -> Testbed:  # noqa: F811
    for user in ("alice",):
        home = bed.users[user].home
        bed.write_file(f"{home}/engine-work/raw.py", RAW)
        bed.run(["chown", user, f"{home}/engine-work/raw.py"])
    return bed


def _raw(tb: Testbed, *requests: bytes) -> list[str]:
    home = tb.users["alice"].home
    argv = ["lev", "run", "--", "python3", "raw.py",
            *(r.decode() if r.startswith(b"@") else base64.b64encode(r).decode()
              for r in requests)]
    r = tb.run(argv, user="alice", cwd=f"{home}/engine-work", check=False, timeout=180)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith('"')]


def _ours() -> list[str]:
    return ["ps", "-a", "--format", "{{.Names}}", "--filter", "label=org.leviath.engine-agent"]


def _clean(tb: Testbed) -> None:
    for cid in podman(tb, "ps", "-a", "-q", "--filter",
                       "label=org.leviath.engine-agent").split():
        tb.run(["podman", "rm", "-f", cid], check=False)


def _refused_and_nothing_made(tb: Testbed, out: list[list[object]], name: str) -> None:
    status, reply = out[0]
    made = podman(tb, "ps", "-a", "--format", "{{.Names}}")
    assert name not in made.split(), f"the engine made {name}: {out}"
    assert status in (400, 403), out
    assert str(reply["message"]).startswith("leviathd: "), reply  # type: ignore[index]


def test_a_volumes_key_with_a_colon_is_no_bind_of_the_hosts_root(bed: Testbed) -> None:  # noqa: F811
    # Break 1: podman's compat layer turned {"/:/host": {}} into a writable bind of /.
    try:
        out = agent(bed, "alice", ["POST", "/containers/create?name=rb-volumes", _create(
            ["cat", "/host/etc/shadow"], Volumes={"/:/host": {}})])
        assert isinstance(out, list)
        _refused_and_nothing_made(bed, out, "rb-volumes")
    finally:
        _clean(bed)


@pytest.mark.parametrize("target", [
    "/v,volume-opt=o=bind,volume-opt=device=/root,volume-opt=type=none",
    "/v,src=bobvol",
], ids=["device-root", "other-volume"])
def test_a_volume_mount_target_cannot_carry_mount_options(bed: Testbed,  # noqa: F811
                                                          target: str) -> None:
    # Break 3: podman formatted Target into its --mount string.
    bed.run(["podman", "volume", "create", "bobvol"], check=False)
    try:
        out = agent(bed, "alice", ["POST", "/containers/create?name=rb-mount", _create(
            ["ls", "/v"], {"Mounts": [{"Type": "volume", "Source": "rbvol", "Target": target}]})])
        assert isinstance(out, list)
        _refused_and_nothing_made(bed, out, "rb-mount")
    finally:
        _clean(bed)
        bed.run(["podman", "volume", "rm", "-f", "bobvol"], check=False)
        bed.run(["podman", "volume", "rm", "-f", "rbvol"], check=False)


def test_a_bare_lf_in_a_header_smuggles_no_second_request(raw_bed: Testbed) -> None:
    # Break 2: Go's server ends a line at a bare LF; our reader split on CRLF
    # only and forwarded the value, so the engine served the rest as a second
    # request the filter never saw (here a create under libpod's API).
    body = json.dumps({"Image": IMAGE, "Cmd": ["true"], "HostConfig": BED_HOST_CONFIG,
                       "Labels": {"org.leviath.engine-agent": "x"}}).encode()
    smuggled = (b"POST /v1.41/containers/create?name=rb-smuggled HTTP/1.1\nHost: d\n"
                b"Content-Type: application/json\nContent-Length: %d\n\n" % len(body) + body)
    raw = (b"GET /v1.41/_ping HTTP/1.1\r\nHost: d\r\nX-A: a\n\n" + smuggled + b"\r\n\r\n")
    try:
        replies = _raw(raw_bed, raw)
        made = podman(raw_bed, "ps", "-a", "--format", "{{.Names}}")
        assert "rb-smuggled" not in made.split(), (replies, made)
        assert replies and replies[0].startswith("HTTP/1.1 400 "), replies
        assert "leviathd: a CR, LF or NUL" in replies[0], replies
    finally:
        _clean(raw_bed)
        raw_bed.run(["podman", "rm", "-f", "rb-smuggled"], check=False)


@pytest.mark.parametrize("param", [
    "nsoptions=" + '[{"Name":"pid","Host":true}]', "securityopt=seccomp=unconfined",
    "addcaps=CAP_SYS_ADMIN", "secrets=../../../etc/shadow", "devices=/dev/null",
    "dockerfile=/etc/shadow",
])
def test_a_build_with_podmans_own_parameters_is_refused(bed: Testbed,  # noqa: F811
                                                        param: str) -> None:
    # Break 5: each of these gave root on the host through the rootful builder.
    from urllib.parse import quote
    name, _, value = param.partition("=")
    out = agent(bed, "alice", ["POST", f"/build?t=rb-build&{name}={quote(value)}", None])
    assert isinstance(out, list)
    status, reply = out[0]
    assert status == 400 or status == 403, out
    assert str(reply["message"]).startswith("leviathd: "), reply  # type: ignore[index]
    assert "rb-build" not in podman(bed, "images", "--format", "{{.Repository}}")


def test_a_host_port_below_1024_is_refused(bed: Testbed) -> None:  # noqa: F811
    try:
        out = agent(bed, "alice", ["POST", "/containers/create?name=rb-port", _create(
            ["true"], {"NetworkMode": "bridge", "PortBindings": {"80/tcp": [
                {"HostIp": "127.0.0.1", "HostPort": "80"}]}})])
        assert isinstance(out, list)
        _refused_and_nothing_made(bed, out, "rb-port")
        assert "below 1024" in str(out[0][1])
    finally:
        _clean(bed)


def test_a_healthcheck_every_second_runs_at_the_floor(bed: Testbed) -> None:  # noqa: F811
    try:
        out = agent(bed, "alice",
                    ["POST", "/containers/create?name=rb-health", _create(
                        ["sleep", "30"], Healthcheck={"Test": ["CMD", "true"],
                                                      "Interval": 1_000_000_000})],
                    ["GET", "/containers/rb-health/json", None])
        assert isinstance(out, list)
        assert out[0][0] == 201, out
        check = out[1][1]["Config"]["Healthcheck"]  # type: ignore[index]
        assert check["Interval"] == 10_000_000_000, check
    finally:
        _clean(bed)


def test_a_field_the_model_does_not_know_is_named_in_the_refusal(bed: Testbed) -> None:  # noqa: F811
    try:
        out = agent(bed, "alice", ["POST", "/containers/create?name=rb-unknown", _create(
            ["true"], {"IDontExist": True})])
        assert isinstance(out, list)
        _refused_and_nothing_made(bed, out, "rb-unknown")
        assert "HostConfig.IDontExist is not a field" in str(out[0][1]), out
    finally:
        _clean(bed)


# Runs inside the agent: creates a container binding ./d read-only, then
# swaps ./d for a link to the hidden ~/.ssh before the container starts (the
# engine mounts a bind's source at start), and prints what the container read.
RACE = r'''
import http.client, json, os, socket, sys, time

class Conn(http.client.HTTPConnection):
    def __init__(self):
        super().__init__("localhost", timeout=60)
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(os.environ["DOCKER_HOST"].removeprefix("unix://"))

def call(method, path, body=None):
    c = Conn()
    c.request(method, path, body=None if body is None else json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read()
    c.close()
    return r.status, raw.decode(errors="replace")

create = json.loads(sys.argv[1])
here = os.getcwd()
os.makedirs("d", exist_ok=True)
with open("d/f", "w") as f:
    f.write("mine\n")
create["HostConfig"]["Binds"] = [f"{here}/d:/d:ro"]
print(json.dumps(["create", *call("POST", "/containers/create?name=rb-race", create)]))
binds = json.loads(call("GET", "/containers/rb-race/json")[1]).get("HostConfig", {}).get("Binds")
print(json.dumps(["binds", binds]))
os.rename("d", "d.old")
os.symlink(os.path.expanduser("~/.ssh"), "d")
print(json.dumps(["start", *call("POST", "/containers/rb-race/start")]))
print(json.dumps(["wait", *call("POST", "/containers/rb-race/wait")]))
print(json.dumps(["logs", *call("GET", "/containers/rb-race/logs?stdout=1&stderr=1")]))
'''


def test_a_bind_source_swapped_for_a_link_after_the_check_reaches_nothing_else(
        raw_bed: Testbed) -> None:
    # Break 7: the filter checked the path, the engine mounted it by path at
    # start; a folder swapped for a link between the two was followed.
    tb = raw_bed
    home = tb.users["alice"].home
    tb.run(["mkdir", "-p", "-m", "0700", f"{home}/.ssh"], user="alice")
    tb.run(["sh", "-c", f"echo TOPSECRET > {home}/.ssh/rb-secret"], user="alice")
    tb.write_file(f"{home}/engine-work/race.py", RACE)
    tb.run(["chown", "alice", f"{home}/engine-work/race.py"])
    tb.run(["rm", "-rf", f"{home}/engine-work/d", f"{home}/engine-work/d.old"])
    create = _create(["sh", "-c", "cat /d/f; cat /d/rb-secret"])
    before = set(_pinned(tb))
    try:
        r = tb.run(["lev", "run", "--", "python3", "race.py", json.dumps(create)],
                    user="alice", cwd=f"{home}/engine-work", check=False, timeout=180)
        assert r.returncode == 0, (r.stdout, r.stderr)
        steps = {s[0]: s[1:] for s in (json.loads(ln) for ln in r.stdout.splitlines()
                                       if ln.startswith("["))}
        assert steps["create"][0] == 201, steps
        assert "TOPSECRET" not in steps["logs"][1], steps
        assert "mine" in steps["logs"][1], steps
        # The engine was handed a pinned path, not the agent's.
        assert str(steps["binds"][0][0]).startswith("/run/leviath/engine-binds/"), steps
    finally:
        _clean(tb)
        tb.run(["rm", "-rf", f"{home}/engine-work/d", f"{home}/engine-work/d.old",
                 f"{home}/.ssh/rb-secret"], check=False)
    # The pins go with the agent (its end hook runs after `lev run` returns:
    # wait for it).
    deadline = time.monotonic() + 30
    while (left := set(_pinned(tb)) - before) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not left, left


def _pinned(tb: Testbed) -> list[str]:
    return tb.run(["sh", "-c", "ls /run/leviath/engine-binds 2>/dev/null || true"]
                  ).stdout.split()


def test_an_upload_over_upload_max_never_reaches_the_engine(raw_bed: Testbed) -> None:
    # "Also" of issue 29: one import wrote 600 MiB as root. Uploads are charged
    # to the agent, at most [sandbox.containers] upload_max over its life.
    from test_engine_socket import CONFIG
    tb = raw_bed
    tb.write_file("/etc/leviath/config.toml", CONFIG + 'upload_max = "64K"\n')
    tb.run(["systemctl", "restart", "leviathd"])
    try:
        body = b"\0" * (200 * 1024)
        home = tb.users["alice"].home
        tb.write_file(f"{home}/engine-work/upload.req", (
            b"POST /v1.41/build?t=rb-upload HTTP/1.1\r\nHost: d\r\nContent-Type: "
            b"application/x-tar\r\nContent-Length: %d\r\n\r\n" % len(body) + body))
        tb.run(["chown", "alice", f"{home}/engine-work/upload.req"])
        replies = _raw(tb, b"@upload.req")
        assert replies and replies[0].startswith("HTTP/1.1 413 "), replies
        assert "upload_max" in replies[0], replies
        assert "rb-upload" not in podman(tb, "images", "--format", "{{.Repository}}")
    finally:
        tb.write_file("/etc/leviath/config.toml", CONFIG)
        tb.run(["systemctl", "restart", "leviathd"])
