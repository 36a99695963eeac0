"""Red team, issue 13 (the agent's container engine socket): the engine
decodes the Docker API's JSON the way Go's encoding/json does, matching an
object's keys to its fields whatever their case. A check reading only the
exact spelling (`HostConfig`, `Privileged`) lets `hostConfig` or
`privileged` through to the engine: a privileged container, root on the
host, from inside an agent.

The bed, image and client are test_engine_socket.py's."""

from __future__ import annotations

import json

import pytest
from podman_list import podman
from test_engine_socket import BED_HOST_CONFIG, CONFIG, IMAGE, _create, agent, bed  # noqa: F401
from testbed import Testbed

pytestmark = pytest.mark.testbed


@pytest.mark.parametrize(
    "body",
    [
        {"Image": IMAGE, "Cmd": ["true"], "HostConfig": {**BED_HOST_CONFIG, "privileged": True}},
        {"Image": IMAGE, "Cmd": ["true"], "hostConfig": {**BED_HOST_CONFIG, "Privileged": True}},
        {"Image": IMAGE, "Cmd": ["true"], "HostConfig": dict(BED_HOST_CONFIG),
         "hostconfig": {**BED_HOST_CONFIG, "PRIVILEGED": True}},
        {"Image": IMAGE, "Cmd": ["true"], "HostConfig": {**BED_HOST_CONFIG, "pidMode": "host"}},
        {"Image": IMAGE, "Cmd": ["true"], "HostConfig": {**BED_HOST_CONFIG, "binds": ["/:/host"]}},
    ],
    ids=["privileged-lower", "hostconfig-camel", "hostconfig-twice", "pidmode-camel",
         "binds-lower"],
)
def test_a_key_spelt_in_another_case_is_checked_all_the_same(
    bed: Testbed, body: dict[str, object],  # noqa: F811
) -> None:
    out = agent(bed, "alice", ["POST", "/containers/create?name=redteam-case", body],
                ["GET", "/containers/json?all=1", None],
                ["GET", "/containers/redteam-case/json", None])
    assert isinstance(out, list)
    status, reply = out[0]
    try:
        if status == 201:
            host = out[2][1].get("HostConfig", {})  # type: ignore[union-attr]
            raise AssertionError(f"created: privileged={host.get('Privileged')} "
                                 f"pid={host.get('PidMode')} binds={host.get('Binds')}")
        assert status in (400, 403), out
        assert str(reply["message"]).startswith("leviathd: "), reply  # type: ignore[index]
        assert out[1] == [200, []], out[1]
    finally:
        for cid in podman(bed, "ps", "-a", "-q", "--filter",
                           "label=org.leviath.engine-agent").split():
            bed.run(["podman", "rm", "-f", cid], check=False)
    assert json.dumps(out)


BLUEPRINT = """
[agent]
name = "launderer"
description = "runs launder.sh"
command = ["sh", "launder.sh"]

[read_paths]
allow = ["~/shared"]
"""

TAINT = """
[agent_read_paths.launderer]
allow = ["~/shared"]

[taint]
enabled = true
on_exceed = "deny"
budget = 16
"""

LAUNDER = """set -e
lev tool read_file "$HOME/shared/doc.txt" >/dev/null
python3 -c 'import subprocess; subprocess.run(["python3", "client.py", \
  *open("reqs.txt").read().splitlines()], check=True, stdout=subprocess.DEVNULL)'
ids=$(lev tool --ledger | python3 -c 'import json,sys; print(" ".join(str(e["id"]) \
  for e in json.load(sys.stdin)["entries"] if e["label"] == "private"))')
lev tool --evict $ids >/dev/null
lev tool read_file laundered.txt >/dev/null
lev tool --ledger | python3 -c 'import json,sys; print("TAINT", json.load(sys.stdin)["taint"])'
"""


def test_a_file_a_container_writes_while_private_is_not_read_back_as_internal(
    bed: Testbed,  # noqa: F811
) -> None:
    """Issue 12 against issue 13: the agent, holding Private data, runs a
    container through its engine socket with the workdir bound; the engine
    builds that container's mounts after the write watch marked the
    agent's, so what it writes there is not labelled. Read back after the
    eviction, it must not come back as Internal."""
    home = bed.users["alice"].home
    bed.run(f"mkdir -p {home}/shared && echo granted > {home}/shared/doc.txt && "
            f"rm -f {home}/engine-work/laundered.txt", user="alice")
    bed.run(f"mkdir -p {home}/rtbp", user="alice")
    for path, text in ((f"{home}/engine-work/launder.sh", LAUNDER),
                       (f"{home}/rtbp/blueprint.toml", BLUEPRINT)):
        bed.write_file(path, text)
        bed.run(["chown", "alice", path])
    bed.write_file("/etc/leviath/config.toml", CONFIG + TAINT)
    bed.run(["systemctl", "restart", "leviathd"])
    try:
        reqs = [["POST", "/containers/create?name=launder-1",
                 _create(["sh", "-c", "echo granted > /w/laundered.txt"],
                         {"Binds": [f"{home}/engine-work:/w"]})],
                ["POST", "/containers/launder-1/start", None],
                ["POST", "/containers/launder-1/wait", None]]
        bed.write_file(f"{home}/engine-work/reqs.txt", "".join(json.dumps(q) + "\n" for q in reqs))
        r = bed.run(["lev", "run", f"{home}/rtbp"],
                    user="alice", cwd=f"{home}/engine-work", check=False, timeout=180)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "granted" in bed.read_file(f"{home}/engine-work/laundered.txt")
        assert "TAINT private" in r.stdout, r.stdout
    finally:
        bed.write_file("/etc/leviath/config.toml", CONFIG)
        bed.run(["systemctl", "restart", "leviathd"])


# Runs inside the agent: makes a running container and an exec in it through
# the filtered socket, then on one connection writes a request the rules pass
# as a stream (exec start, attach) that the engine answers without taking the
# stream over, and right behind it a second request that the rules refuse
# (libpod's API). Prints the engine's replies on that connection.
SMUGGLE = r'''
import json, os, socket, sys, time

path = os.environ["DOCKER_HOST"].removeprefix("unix://")

def call(method, target, body=None):
    s = socket.socket(socket.AF_UNIX); s.connect(path)
    data = b"" if body is None else json.dumps(body).encode()
    s.sendall(f"{method} {target} HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    raw = b""
    while chunk := s.recv(65536):
        raw += chunk
    s.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest

create = json.loads(sys.argv[1])
status, out = call("POST", "/containers/create?name=smuggle-1", create)
assert status == 201, (status, out)
cid = json.loads(out)["Id"]
assert call("POST", f"/containers/{cid}/start")[0] == 204
status, out = call("POST", f"/containers/{cid}/exec",
                   {"Cmd": ["echo", "streamed-ok"], "AttachStdout": True, "Tty": True})
assert status == 201, (status, out)
eid = json.loads(out)["Id"]
first = {
    "stream": ("POST", f"/exec/{eid}/start", {"Detach": False, "Tty": True}),
    "detached-exec": ("POST", f"/exec/{eid}/start", {"Detach": True, "Tty": False}),
    "exec-start-by-get": ("GET", f"/exec/{eid}/start", None),
    "attach-refused-by-engine": ("POST", f"/containers/{cid}/attach?stream=1&detachKeys=ctrl-",
                                 None),
}[sys.argv[2]]
method, target, body = first
data = b"" if body is None else json.dumps(body).encode()
second = b"" if sys.argv[2] == "stream" else b"GET /v1.41/libpod/info HTTP/1.1\r\nHost: d\r\n\r\n"
s = socket.socket(socket.AF_UNIX); s.connect(path)
s.sendall(f"{method} {target} HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
          f"Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: {len(data)}\r\n\r\n".encode()
          + data + second)
s.settimeout(5)
raw = b""
deadline = time.monotonic() + 8
try:
    while time.monotonic() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            break
        raw += chunk
except OSError:
    pass
print("REPLY " + json.dumps(raw.decode(errors="replace")))
'''


@pytest.mark.parametrize("first", ["detached-exec", "exec-start-by-get",
                                   "attach-refused-by-engine", "stream"])
def test_a_request_behind_a_stream_the_engine_does_not_take_is_not_passed(
    bed: Testbed, first: str,  # noqa: F811
) -> None:
    """A stream decision relays the client's bytes to the engine raw. When
    the engine answers the request as a plain one (a detached exec start, a
    method it does not serve, an error before it takes the stream), it keeps
    the connection for the next request: what the agent wrote behind the
    first one would reach the engine unfiltered."""
    home = bed.users["alice"].home
    bed.write_file(f"{home}/engine-work/smuggle.py", SMUGGLE)
    bed.run(["chown", "alice", f"{home}/engine-work/smuggle.py"])
    create = _create(["sleep", "60"])
    try:
        r = bed.run(["lev", "run", "--", "python3", "smuggle.py", json.dumps(create), first],
                    user="alice", cwd=f"{home}/engine-work", check=False, timeout=180)
        assert r.returncode == 0, (r.stdout, r.stderr)
        line = next(x for x in r.stdout.splitlines() if x.startswith("REPLY "))
        reply = json.loads(line.removeprefix("REPLY "))
        # libpod/info's reply names the engine's store and host; one status
        # line is the first request's alone.
        assert '"graphRoot"' not in reply and reply.count("HTTP/1.1 ") <= 1, reply[:2000]
        if first == "stream":  # what is a stream still is one
            assert reply.startswith("HTTP/1.1 101") and "streamed-ok" in reply, reply[:2000]
    finally:
        for cid in podman(bed, "ps", "-a", "-q", "--filter",
                           "label=org.leviath.engine-agent").split():
            bed.run(["podman", "rm", "-f", cid], check=False)


def test_a_log_file_path_of_the_agents_choosing_is_refused(bed: Testbed) -> None:  # noqa: F811
    """podman writes a container's log where `--log-opt path=` says, as
    root: through the agent's socket, that would be a root write anywhere."""
    probe = "/var/tmp/leviath-redteam-logpath"
    bed.run(["rm", "-f", probe])
    body = _create(["echo", "written-by-the-engine"],
                   {"LogConfig": {"Type": "k8s-file", "Config": {"path": probe}}})
    try:
        out = agent(bed, "alice", ["POST", "/containers/create?name=logpath-1", body],
                    ["POST", "/containers/logpath-1/start", None],
                    ["POST", "/containers/logpath-1/wait", None])
        assert isinstance(out, list)
        wrote = bed.run(["cat", probe], check=False).stdout
        assert "written-by-the-engine" not in wrote, (out, wrote)
        assert out[0][0] == 403 and "--log-opt path" in str(out[0][1]), out
    finally:
        bed.run(["rm", "-f", probe], check=False)
        for cid in podman(bed, "ps", "-a", "-q", "--filter",
                           "label=org.leviath.engine-agent").split():
            bed.run(["podman", "rm", "-f", cid], check=False)
