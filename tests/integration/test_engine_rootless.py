"""The agent's container engine is its user's own rootless podman (issue 29,
leviathd/enginesock/rootless.py), seen from the attacker's side: from inside
real agents in the test bed, with raw requests on $DOCKER_HOST and with the
docker CLI. Whatever a request gets past the filter, the engine holds only
the agent's user's rights: its containers' processes are that user on the
host, live in the agent's scope, and are gone (with everything the agent
imported) after `lev stop`.

Each agent starts with an empty storage of its own, so it imports the image
itself, from a tarball of the bed's static busybox in its workdir (no
registry).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest
from test_engine_socket_cli import BED_RUN, DOCKER, DOCKER_DIR, compose_file
from testbed import Testbed

pytestmark = pytest.mark.testbed

CONFIG = """[sandbox]
kind = "namespace"
[sandbox.containers]
enabled = true
"""
# (podman 4.3 tags an import :latest whatever its tag parameter says)
IMAGE = "localhost/leviath-rootless-busybox:latest"
TARBALL = "bb.tar"

MAKE_TARBALL = r"""set -e
command -v podman >/dev/null || { echo "no podman in the bed" >&2; exit 3; }
[ -x /bin/busybox ] || { echo "no static busybox (busybox-static) in the bed" >&2; exit 3; }
d=$(mktemp -d /var/tmp/leviath-image.XXXXXX); chmod 755 "$d"
mkdir -p "$d/bin" "$d/etc" "$d/tmp" "$d/proc" "$d/sys" "$d/dev" "$d/root"; chmod 1777 "$d/tmp"
cp /bin/busybox "$d/bin/busybox"
for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$d/bin/$a"; done
echo 'root:x:0:0:root:/root:/bin/sh' > "$d/etc/passwd"; echo 'root:x:0:' > "$d/etc/group"
tar -C "$d" -cf "$1" .
rm -rf "$d"
"""

# Runs inside the agent. Arguments are JSON requests [method, path, body];
# "IMPORT" posts the tarball as a new image, "BUILD" a context of one
# Dockerfile (the body), "SLEEP" waits, "WAITFOR" waits for a file, "OUT" names a
# file the replies are written to as well. One JSON line per request.
CLIENT = r'''
import http.client, json, os, socket, sys, time

class Conn(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=120)
        self.path_ = path
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(self.path_)

host = os.environ.get("DOCKER_HOST", "").removeprefix("unix://")
out = []
target = None
def say(x):
    out.append(x)
    print(json.dumps(x), flush=True)
    if target:
        with open(target + ".part", "w") as f:
            json.dump(out, f)
        os.rename(target + ".part", target)
say(["DOCKER_HOST", os.environ.get("DOCKER_HOST", "")])
for arg in sys.argv[1:]:
    method, path, body = json.loads(arg)
    if method == "OUT":
        target = path; continue
    if method == "SLEEP":
        time.sleep(float(path)); continue
    if method == "WAITFOR":  # until the file `path` exists
        while not os.path.exists(path):
            time.sleep(0.2)
        continue
    headers = {"Content-Type": "application/json"}
    data = None if body is None else json.dumps(body)
    if method == "IMPORT":
        method, headers = "POST", {"Content-Type": "application/x-tar"}
        data = open(body, "rb").read()
    if method == "BUILD":  # body: the Dockerfile, the whole context
        import io, tarfile
        ctx = io.BytesIO()
        with tarfile.open(fileobj=ctx, mode="w") as t:
            info = tarfile.TarInfo("Dockerfile"); info.size = len(body.encode())
            t.addfile(info, io.BytesIO(body.encode()))
        method, headers, data = "POST", {"Content-Type": "application/x-tar"}, ctx.getvalue()
    c = Conn(host)
    try:
        c.request(method, path, body=data, headers=headers)
        r = c.getresponse()
        raw = r.read()
        try:
            reply = json.loads(raw) if raw.strip() else None
        except ValueError:
            reply = raw.decode(errors="replace")
        say([r.status, reply])
    except Exception as exc:
        say([0, repr(exc)])
'''

IMPORT = ["IMPORT", "/images/create?fromSrc=-&repo=localhost/leviath-rootless-busybox"
          "&tag=latest", TARBALL]
# What podman needs in the bed (tests/testbed/README.md, "Podman inside").
BED_HOST_CONFIG = {"Runtime": "runc", "NetworkMode": "none", "Ulimits": [
    {"Name": "nofile", "Soft": 1024, "Hard": 1024}, {"Name": "nproc", "Soft": 1000, "Hard": 1000}]}


def _create(cmd: list[str], host_config: dict[str, object] | None = None,
            **extra: object) -> dict[str, object]:
    return {"Image": IMAGE, "Cmd": cmd, "HostConfig": {**BED_HOST_CONFIG, **(host_config or {})},
            **extra}


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    for user in ("alice", "bob"):
        home = testbed.users[user].home
        testbed.run(["mkdir", "-p", "rootless-work"], user=user)
        r = testbed.run(["sh", "-c", MAKE_TARBALL, "sh", f"{home}/rootless-work/{TARBALL}"],
                        check=False, timeout=180)
        if r.returncode == 3:
            pytest.skip(r.stderr.strip())
        assert r.returncode == 0, r.stderr
        testbed.write_file(f"{home}/rootless-work/client.py", CLIENT)
        testbed.run(["chown", "-R", f"{user}:", f"{home}/rootless-work"])
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    testbed.run(["systemctl", "restart", "leviathd"])
    yield testbed
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "restart", "leviathd"])


def agent(bed: Testbed, user: str, *requests: list[object],
          detach: bool = False) -> list[list[object]] | str:
    argv = ["lev", "run", *(["--detach"] if detach else []), "--", "python3", "client.py",
            *(json.dumps(r) for r in requests)]
    home = bed.users[user].home
    r = bed.run(argv, user=user, cwd=f"{home}/rootless-work", check=False, timeout=240)
    assert r.returncode == 0, (r.stdout, r.stderr)
    if detach:
        return r.stdout.strip()
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("[")]
    assert lines and lines[0] == ["DOCKER_HOST", "unix:///run/leviath/engine.sock"], r.stdout
    return lines[1:]


def _wait_file(bed: Testbed, path: str, entries: int, seconds: float = 120) -> list[list[object]]:
    deadline = time.monotonic() + seconds
    while True:
        r = bed.run(["cat", path], check=False)
        if r.returncode == 0 and r.stdout.strip():
            got = json.loads(r.stdout)
            if len(got) >= entries:
                return [x for x in got if x[0] != "DOCKER_HOST"]
        assert time.monotonic() < deadline, f"the agent never wrote {entries} replies to {path}"
        time.sleep(0.3)


def _host_pid(bed: Testbed, cmdline: str) -> int:
    """The machine's pid of the one process running `cmdline`: the engine
    reports pids as its own PID namespace numbers them (issue 43)."""
    pids = bed.run(["pgrep", "-xf", cmdline]).stdout.split()
    assert len(pids) == 1, pids
    return int(pids[0])


def _alive(bed: Testbed, pid: int) -> bool:
    return bed.run(["test", "-e", f"/proc/{pid}"], check=False).returncode == 0


def test_a_containers_processes_are_the_agents_user_in_its_scope_and_end_with_it(
        bed: Testbed) -> None:
    home = bed.users["alice"].home
    out = f"{home}/rootless-work/held.json"
    bed.run(["rm", "-f", out])
    agent_id = agent(
        bed, "alice", ["OUT", "held.json", None], IMPORT,
        ["POST", "/containers/create?name=held", _create(["sleep", "3171"])],
        ["POST", "/containers/held/start", None],
        ["GET", "/containers/held/json", None],
        ["SLEEP", "600", None], detach=True)
    assert isinstance(agent_id, str)
    try:
        imported, create, start, inspect = _wait_file(bed, out, 5)
        assert imported[0] == 200, imported
        assert create[0] == 201, create
        assert start[0] == 204, start
        assert inspect[1]["State"]["Running"], inspect  # type: ignore[index]
        pid = _host_pid(bed, "sleep 3171")
        # Read while the agent holds the container alive (its client sleeps).
        status = bed.run(["cat", f"/proc/{pid}/status"]).stdout
        cgroups = bed.run(["cat", f"/proc/{pid}/cgroup"]).stdout
        cmdline = bed.run(["cat", f"/proc/{pid}/cmdline"]).stdout
        assert cmdline.split("\0")[:2] == ["sleep", "3171"], cmdline
        uid = bed.users["alice"].uid
        uids = next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1:]
        assert uids == [str(uid)] * 4, status  # the agent's user on the host, never root
        systemd = next(ln for ln in cgroups.splitlines() if ":name=systemd:" in ln
                       or ln.startswith("0::"))
        assert agent_id in systemd and ".scope" in systemd, cgroups  # in the agent's scope
        # Its storage is the agent's own, the user's, not root's.
        st = bed.run(["stat", "-c", "%u %a",
                      f"/var/lib/leviath/engine-storage/{agent_id}"]).stdout.split()
        assert st == [str(uid), "700"], st
    finally:
        bed.run(["lev", "stop", agent_id], user="alice", check=False)
    deadline = time.monotonic() + 60
    while _alive(bed, pid):
        assert time.monotonic() < deadline, f"the container's process {pid} outlived lev stop"
        time.sleep(0.3)
    deadline = time.monotonic() + 60
    while bed.run(["test", "-e", f"/var/lib/leviath/engine-storage/{agent_id}"],
                  check=False).returncode == 0:
        assert time.monotonic() < deadline, "the agent's engine storage outlived it"
        time.sleep(0.3)
    assert bed.run(["test", "-e", f"/run/leviath/engine/{agent_id}.sock"],
                   check=False).returncode != 0


def test_a_volumes_key_or_a_bind_of_shadow_reads_nothing_root_may_read(bed: Testbed) -> None:
    bed.run(["rm", "-f", "/root/leviath-rootless-pwned"])
    shadow_root = bed.run(["sh", "-c", "grep '^root:' /etc/shadow"]).stdout.strip()
    bob = bed.users["bob"]
    secret = "bobs-secret-" + os.urandom(6).hex()
    bed.write_file(f"{bob.home}/leviath-secret", secret + "\n", mode=0o600)
    bed.run(["chown", "bob:", f"{bob.home}/leviath-secret"])
    script = ("cat /host/etc/shadow; cat /s; echo planted > /host/root/leviath-rootless-pwned;"
              f" cat /host{bob.home}/leviath-secret; ls /host/root; id")
    out = agent(
        bed, "alice", IMPORT,
        ["POST", "/containers/create?name=vol", _create(["sh", "-c", script],
                                                        Volumes={"/:/host": {}})],
        ["POST", "/containers/vol/start", None],
        ["POST", "/containers/vol/wait", None],
        ["GET", "/containers/vol/logs?stdout=1&stderr=1", None],
        ["POST", "/containers/create?name=shadow",
         _create(["sh", "-c", script], {"Binds": ["/etc/shadow:/s:ro"]})],
        ["POST", "/containers/shadow/start", None],
        ["POST", "/containers/shadow/wait", None],
        ["GET", "/containers/shadow/logs?stdout=1&stderr=1", None],
    )
    assert isinstance(out, list)
    assert out[0][0] == 200, out[0]
    for reply in out[1:]:
        # Refused by the filter or run: either way, never root's file, nor another user's.
        assert shadow_root not in json.dumps(reply), reply
        assert secret not in json.dumps(reply), reply
    assert bed.run(["test", "-e", "/root/leviath-rootless-pwned"], check=False).returncode != 0


def test_an_agent_without_subordinate_ids_is_refused_with_a_reason(bed: Testbed) -> None:
    erin = bed.users.get("erin") or bed.add_user("erin", ("leviath",))
    bed.run(["sh", "-c", "sed -i '/^erin:/d' /etc/subuid /etc/subgid"])
    bed.run(["mkdir", "-p", "w"], user="erin")
    r = bed.run(["lev", "run", "--", "true"], user="erin", cwd=f"{erin.home}/w", check=False,
                timeout=120)
    assert r.returncode != 0, r.stdout
    assert "rootless podman" in r.stderr and "subordinate ids in /etc/subuid" in r.stderr, \
        r.stderr


COMPOSE = compose_file(IMAGE)
DOCKERFILE = f"""FROM {IMAGE}
COPY hello.txt /hello.txt
RUN echo built-by-run > /built.txt
"""


@pytest.fixture(scope="module")
def cli(bed: Testbed) -> Testbed:
    docker = f"{DOCKER_DIR}/bin/docker"
    compose = f"{DOCKER_DIR}/cli-plugins/docker-compose"
    if not (os.access(docker, os.X_OK) and os.access(compose, os.X_OK)):
        pytest.skip(f"no docker CLI and compose in {DOCKER_DIR} (scripts/setup fetches them)")
    bed.run(["install", "-D", "-m", "0755", docker, DOCKER])
    bed.run(["install", "-D", "-m", "0755", compose,
             "/usr/libexec/docker/cli-plugins/docker-compose"])
    work = f"{bed.users['alice'].home}/rootless-work"
    bed.run(["mkdir", "-p", f"{work}/stack", f"{work}/ctx"], user="alice")
    bed.write_file(f"{work}/stack/compose.yaml", COMPOSE)
    bed.write_file(f"{work}/ctx/Dockerfile", DOCKERFILE)
    bed.write_file(f"{work}/ctx/hello.txt", "hello from the context\n")
    bed.write_file(f"{work}/to-copy.txt", "copied in\n")
    bed.run(["chown", "-R", "alice:", work])
    return bed


def test_docker_run_build_cp_and_compose_work_on_the_users_engine(cli: Testbed) -> None:
    script = f"""set -e
echo $DOCKER_HOST
{DOCKER} import {TARBALL} {IMAGE} >/dev/null
{DOCKER} run --name st-1 {BED_RUN} {IMAGE} sh -c 'echo hello from docker run; id -u' || true
{DOCKER} rm st-1 >/dev/null
{DOCKER} run --rm {BED_RUN} {IMAGE} true && echo run-rm-ok
{DOCKER} build -q --network none -t localhost/rootless-built:1 ctx >/dev/null && echo build-ok
{DOCKER} run --rm {BED_RUN} localhost/rootless-built:1 cat /hello.txt /built.txt
{DOCKER} run -d --name cp-1 {BED_RUN} {IMAGE} sleep 300 >/dev/null
{DOCKER} cp to-copy.txt cp-1:/tmp/in.txt
{DOCKER} exec cp-1 cat /tmp/in.txt
{DOCKER} exec cp-1 sh -c 'echo copied out > /tmp/out.txt'
{DOCKER} cp cp-1:/tmp/out.txt ./out.txt && cat ./out.txt
{DOCKER} rm -f cp-1 >/dev/null
cd stack
{DOCKER} compose -p stack up -d 2>/dev/null
{DOCKER} compose -p stack ps --format '{{{{.Service}}}} {{{{.State}}}}' | sort
{DOCKER} compose -p stack down -t 0 2>/dev/null && echo down-ok
{DOCKER} ps -a -q | wc -l
"""
    home = cli.users["alice"].home
    cli.run(["rm", "-f", f"{home}/rootless-work/out.txt"])
    r = cli.run(["lev", "run", "--", "sh", "-c", script], user="alice",
                cwd=f"{home}/rootless-work", check=False, timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    out = r.stdout
    assert out.splitlines()[0] == "unix:///run/leviath/engine.sock", out
    assert "hello from docker run\n0\n" in out, out  # root in the container: the user outside
    assert "run-rm-ok" in out and "build-ok" in out, (out, r.stderr)
    assert "hello from the context\nbuilt-by-run\n" in out, out
    assert "copied in\n" in out and "copied out\n" in out, out
    assert "db running\nweb running\n" in out and "down-ok" in out, (out, r.stderr)
    assert out.splitlines()[-1].strip() == "0", out
    # What docker cp wrote out is the user's own file.
    st = cli.run(["stat", "-c", "%u", f"{home}/rootless-work/out.txt"]).stdout.strip()
    assert st == str(cli.users["alice"].uid), st


NO_NETWORK = """[sandbox]
network = false
"""
LISTENER = "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 5 10.213.0.1 18213"
# The build step's probe says what nc got and its status, beside a control:
# the same nc reaching a listener on the step's own lo, so a client that
# cannot run (or a step that never ran) fails the test instead of looking
# like a refusal. Its words are made by the shell ($((1+1))): the build's
# stream echoes the step's source, which must not read as its output.
INNER = 18214
PROBE = (
    "mkdir -p /tmp/w && echo inner-$((2+2)) > /tmp/w/f; "
    f"httpd -f -p 127.0.0.1:{INNER} -h /tmp/w & h=$!; "
    f"i=0; until grep -q ':{INNER:04X} 00000000:0000 0A' /proc/net/tcp "
    "|| [ $((i+=1)) -gt 200 ]; do sleep 0.05; done; "
    f"o=$(printf 'GET /f HTTP/1.0\\r\\n\\r\\n' | nc -w 5 127.0.0.1 {INNER} 2>&1); "
    "echo \"CTL$((1+1)) rc=$? $o\" | tr '\\r\\n' '  '; echo; kill $h; "
    "o=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 10.213.0.1 18213 2>&1); "
    "echo \"PROBE$((1+1)) rc=$? $o\" | tr '\\r\\n' '  '; echo")


def test_an_agent_without_network_gets_an_engine_without_it(bed: Testbed) -> None:
    # An address of the bed's own network namespace outside 127/8 (on lo: the
    # bed's kernel has no dummy links), with a listener as root.
    bed.run(["ip", "addr", "add", "10.213.0.1/32", "dev", "lo"])
    bed.run(["systemd-run", "--quiet", "--unit=leviath-test-listener", "python3", "-m",
             "http.server", "--bind", "10.213.0.1", "18213"])
    bob = bed.users["bob"]
    bed.run(["mkdir", "-p", f"{bob.home}/.config/leviath"], user="bob")
    bed.write_file(f"{bob.home}/.config/leviath/config.toml", NO_NETWORK)
    bed.run(["chown", "bob:", f"{bob.home}/.config/leviath/config.toml"])
    try:
        deadline = time.monotonic() + 30
        while " 200 " not in bed.run(["sh", "-c", LISTENER], check=False).stdout:
            assert time.monotonic() < deadline, "the listener never answered"
            time.sleep(0.3)
        # A build's RUN step: the engine's own network unless told otherwise.
        out = agent(bed, "bob", IMPORT,
                    ["BUILD", "/build?t=localhost/net-probe:1", f"FROM {IMAGE}\nRUN {PROBE}\n"])
        assert isinstance(out, list)
        imported, built = out
        assert imported[0] == 200, out
        text = json.dumps(built)
        assert built[0] == 200, out
        assert "CTL2 rc=0 " in text and "inner-4" in text, out  # the client works
        assert "PROBE2 rc=1 " in text and "Network is unreachable" in text, out
        assert "Directory listing" not in text, out
    finally:
        bed.run(["rm", "-f", f"{bob.home}/.config/leviath/config.toml"])
        bed.run(["systemctl", "stop", "leviath-test-listener"], check=False)
        bed.run(["ip", "addr", "del", "10.213.0.1/32", "dev", "lo"], check=False)


def test_the_engine_outlives_a_daemon_restart_and_an_end_while_away_is_swept(
        bed: Testbed) -> None:
    home = bed.users["alice"].home
    out, go = f"{home}/rootless-work/restart.json", f"{home}/rootless-work/restart.go"
    bed.run(["rm", "-f", out, go])
    agent_id = agent(
        bed, "alice", ["OUT", "restart.json", None], IMPORT,
        ["POST", "/containers/create?name=kept", _create(["sleep", "3172"])],
        ["POST", "/containers/kept/start", None],
        ["GET", "/containers/kept/json", None],
        ["WAITFOR", "restart.go", None],
        ["GET", "/containers/kept/json", None],
        ["SLEEP", "600", None], detach=True)
    assert isinstance(agent_id, str)
    storage = f"/var/lib/leviath/engine-storage/{agent_id}"
    try:
        _imported, create, start, inspect = _wait_file(bed, out, 5)
        assert create[0] == 201 and start[0] == 204, (create, start)
        engine_pid = inspect[1]["State"]["Pid"]  # type: ignore[index]
        pid = _host_pid(bed, "sleep 3172")
        cgroups = bed.run(["cat", f"/proc/{pid}/cgroup"]).stdout
        unit = next(part for part in cgroups.split("/") if part.endswith(".scope\n")
                    or part.endswith(".scope")).strip()
        bed.run(["systemctl", "restart", "leviathd"])
        bed.run(["lev", "ps"], user="alice")  # the new daemon is serving
        bed.run(["touch", go], user="alice")
        after = _wait_file(bed, out, 6)[-1]
        # The same engine, with the same container, through the new daemon's proxy.
        assert after[0] == 200 and after[1]["State"]["Pid"] == engine_pid, after  # type: ignore[index]
        assert _alive(bed, pid)
        # The agent ends while the daemon is away: the next daemon sweeps its engine.
        bed.run(["systemctl", "stop", "leviathd"])
        bed.run(["systemctl", "stop", unit])
        deadline = time.monotonic() + 60
        while _alive(bed, pid):
            assert time.monotonic() < deadline, f"the container's process {pid} outlived its scope"
            time.sleep(0.3)
        assert bed.run(["test", "-e", storage], check=False).returncode == 0  # nobody swept yet
        bed.run(["systemctl", "start", "leviathd"])
        deadline = time.monotonic() + 60
        while bed.run(["test", "-e", storage], check=False).returncode == 0:
            assert time.monotonic() < deadline, "the restarted daemon never swept the storage"
            time.sleep(0.3)
        assert bed.run(["test", "-e", f"/run/leviath/engine/{agent_id}.sock"],
                       check=False).returncode != 0
        assert bed.run(["test", "-e", f"/run/leviath/engine-user/{agent_id}"],
                       check=False).returncode != 0
    finally:
        bed.run(["systemctl", "start", "leviathd"], check=False)
        bed.run(["lev", "stop", agent_id], user="alice", check=False)


def test_a_healthcheck_runs_nothing_outside_the_agents_scope(bed: Testbed) -> None:
    # Rootful podman ran `podman healthcheck run` as root from a system timer
    # every interval; the user's engine has no timer of root's to ask for.
    health = {"Test": ["CMD", "true"], "Interval": 1_000_000_000, "Timeout": 1_000_000_000,
              "Retries": 1}
    before = bed.run(["systemctl", "list-units", "--all", "--plain", "--no-legend"]).stdout
    out = agent(
        bed, "alice", IMPORT,
        ["POST", "/containers/create?name=hc",
         _create(["sleep", "30"], Healthcheck=health)],
        ["POST", "/containers/hc/start", None],
        ["SLEEP", "3", None],
        ["GET", "/containers/hc/json", None],
    )
    after = bed.run(["systemctl", "list-units", "--all", "--plain", "--no-legend"]).stdout
    assert isinstance(out, list)
    def units(text: str) -> set[str]:
        return {line.split()[0] for line in text.splitlines() if line.strip()}

    new = units(after) - units(before)
    assert not [u for u in new if "podman" in u or u.endswith(".timer")], new
    assert out[1][0] in (201, 403), out  # made, or refused by the filter


def inspect_agent(bed: Testbed, user: str, folder: str) -> str:
    """`lev inspect` of a running agent of `user`'s: its sandbox as the daemon built it."""
    home = bed.users[user].home
    r = bed.run(["lev", "run", "--detach", "--", "sleep", "120"], user=user,
                cwd=f"{home}/{folder}", timeout=120)
    agent_id = r.stdout.strip()
    try:
        return bed.run(["lev", "inspect", agent_id], user=user, cwd=f"{home}/{folder}").stdout
    finally:
        bed.run(["lev", "stop", agent_id], user=user, check=False)


def test_lev_inspect_says_whose_engine_it_is(bed: Testbed) -> None:
    out = inspect_agent(bed, "alice", "rootless-work")
    assert "container engine: the user's own rootless podman" in out, out
    assert "ROOT ON THE HOST" not in out, out


def test_an_agent_killed_outright_leaves_no_engine_behind(bed: Testbed) -> None:
    home = bed.users["alice"].home
    out = f"{home}/rootless-work/killed.json"
    bed.run(["rm", "-f", out])
    agent_id = agent(
        bed, "alice", ["OUT", "killed.json", None], IMPORT,
        ["POST", "/containers/create?name=doomed", _create(["sleep", "3173"])],
        ["POST", "/containers/doomed/start", None],
        ["GET", "/containers/doomed/json", None],
        ["SLEEP", "600", None], detach=True)
    assert isinstance(agent_id, str)
    _imported, _create_reply, start, inspect = _wait_file(bed, out, 5)
    assert start[0] == 204, start
    assert inspect[1]["State"]["Running"], inspect  # type: ignore[index]
    pid = _host_pid(bed, "sleep 3173")
    storage = f"/var/lib/leviath/engine-storage/{agent_id}"
    # The user's engine, with storage of the agent's own (root's, before issue 29).
    status = bed.run(["cat", f"/proc/{pid}/status"]).stdout
    assert f"Uid:\t{bed.users['alice'].uid}\t" in status, status
    assert bed.run(["test", "-d", storage], check=False).returncode == 0
    bed.run(["systemctl", "kill", "--signal=KILL", f"leviath-*-{agent_id}.scope"])
    deadline = time.monotonic() + 60
    while _alive(bed, pid) or bed.run(["test", "-e", storage], check=False).returncode == 0:
        assert time.monotonic() < deadline, "the killed agent's container or storage stayed"
        time.sleep(0.3)
    # Nothing of alice's left in that scope, nor anywhere naming its folders.
    left = bed.run(["sh", "-c", "for p in $(pgrep -u alice); do "
                    "echo $p $(grep name=systemd /proc/$p/cgroup) $(tr '\\0' ' ' "
                    "</proc/$p/cmdline); done"]).stdout
    assert not [ln for ln in left.splitlines() if agent_id in ln], left



def test_a_bind_reaches_the_users_engine_as_the_agents_own_path(bed: Testbed) -> None:
    # The engine runs in the agent's view (issue 43, enginesock/engineroot.py):
    # it gets the agent's own path, no pin, and reads the folder as the user,
    # through the user's 0700 folder.
    home = bed.users["alice"].home
    work = f"{home}/rootless-work"
    out = f"{work}/pin.json"
    src = f"{work}/private/pind"
    bed.run(["rm", "-rf", out, f"{work}/private"])
    bed.run(["mkdir", "-p", "-m", "0700", f"{work}/private"], user="alice")
    bed.run(["mkdir", "-p", "-m", "0755", src], user="alice")
    marker = "pinned-" + os.urandom(4).hex()
    bed.run(["sh", "-c", f"echo {marker} > {src}/marker && chmod 0644 {src}/marker"],
            user="alice")
    replies = agent(
        bed, "alice", IMPORT,
        ["POST", "/containers/create?name=pinned",
         _create(["cat", "/p/marker"], {"Binds": [f"{src}:/p:ro"]})],
        ["GET", "/containers/pinned/json", None],
        ["POST", "/containers/pinned/start", None],
        ["POST", "/containers/pinned/wait", None],
        ["GET", "/containers/pinned/logs?stdout=1&stderr=1", None])
    assert isinstance(replies, list)
    imported, create, inspect, start, wait, logs = replies
    assert imported[0] == 200 and create[0] == 201, (imported, create)
    binds = inspect[1]["HostConfig"]["Binds"]  # type: ignore[index]
    assert str(binds[0]).split(":")[0] == src, binds
    # (a filter's look-up that the engine failed says so, with the engine's
    # words in the daemon's journal: shown if it ever happens again)
    assert start[0] == 204 and wait[0] == 200, (start, wait, _engine_said(bed))
    assert marker in json.dumps(logs), logs


def _engine_said(bed: Testbed) -> str:
    return bed.run(["sh", "-c", "journalctl -u leviathd --no-pager -o cat | "
                    "grep 'the engine answered' | tail -5"], check=False).stdout
