"""The filtered engine socket (issue 13) with the docker CLI and docker compose
v2 as an agent uses them: Debian's binaries (trixie's docker-cli and
docker-compose, which scripts/setup unpacks into /opt/leviath-dev/docker
without installing dockerd), run inside real agents against the daemon's
rootful podman service. The image is the one test_engine_socket.py imports
from a tarball of the host's static busybox.
"""

from __future__ import annotations

import os
import time
from subprocess import CompletedProcess

import pytest
from podman_list import podman
from test_engine_socket import IMAGE, _leftovers, _wait_gone, bed  # noqa: F401
from testbed import Testbed

pytestmark = pytest.mark.testbed

DOCKER_DIR = os.environ.get("LEVIATH_DOCKER_DIR", "/opt/leviath-dev/docker")
DOCKER = "/usr/bin/docker"  # the bed's /usr/local/bin may hold another docker
# What podman needs in the bed (tests/testbed/README.md, "Podman inside").
BED_RUN = ("--runtime runc --network none --ulimit nofile=1024:1024 "
           "--ulimit nproc=1000:1000")


def compose_file(image: str) -> str:
    """A two-service compose file of `image` that podman in the bed can run."""
    return f"""services:
  web:
    image: {image}
    command: ["sleep", "300"]
    runtime: runc
    network_mode: none
    ulimits: {{nofile: 1024, nproc: 1000}}
  db:
    image: {image}
    command: ["sleep", "300"]
    runtime: runc
    network_mode: none
    ulimits: {{nofile: 1024, nproc: 1000}}
"""


COMPOSE = compose_file(IMAGE)


@pytest.fixture(scope="module")
def cli(bed: Testbed) -> Testbed:  # noqa: F811
    docker = f"{DOCKER_DIR}/bin/docker"
    compose = f"{DOCKER_DIR}/cli-plugins/docker-compose"
    if not (os.access(docker, os.X_OK) and os.access(compose, os.X_OK)):
        pytest.skip(f"no docker CLI and compose in {DOCKER_DIR} (scripts/setup fetches them)")
    # Where Debian's packages put them (the bed's root is an overlay: the host is untouched).
    bed.run(["install", "-D", "-m", "0755", docker, DOCKER])
    bed.run(["install", "-D", "-m", "0755", compose,
             "/usr/libexec/docker/cli-plugins/docker-compose"])
    home = bed.users["alice"].home
    bed.run(["mkdir", "-p", f"{home}/engine-work/stack"], user="alice")
    bed.write_file(f"{home}/engine-work/stack/compose.yaml", COMPOSE)
    bed.run(["chown", "-R", "alice", f"{home}/engine-work/stack"])
    return bed


def shell(tb: Testbed, user: str, script: str, *, detach: bool = False,
          cwd: str = "engine-work") -> CompletedProcess[str]:
    home = tb.users[user].home
    argv = ["lev", "run", *(["--detach"] if detach else []), "--", "sh", "-c", script]
    return tb.run(argv, user=user, cwd=f"{home}/{cwd}", check=False, timeout=180)


def test_docker_run_through_the_agents_socket(cli: Testbed) -> None:
    # (podman 4.3 answers a --rm run's wait with status 0 whatever the exit,
    # on its own socket too: the status is checked without --rm.)
    r = shell(cli, "alice", f"echo $DOCKER_HOST; {DOCKER} run --name st-1 {BED_RUN} {IMAGE} "
              "sh -c 'echo hello from docker run; exit 3'; echo status=$?; "
              f"{DOCKER} rm st-1 >/dev/null; "
              f"{DOCKER} run --rm {BED_RUN} {IMAGE} true && echo true-ok; "
              f"{DOCKER} ps -a -q | wc -l")
    assert r.returncode == 0, (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert lines[0] == "unix:///run/leviath/engine.sock", r.stdout
    assert "hello from docker run" in r.stdout and "status=3" in r.stdout, r.stdout
    assert "true-ok" in r.stdout, (r.stdout, r.stderr)
    assert lines[-1].strip() == "0", r.stdout  # --rm: nothing left


def test_docker_refusals_read_as_engine_errors(cli: Testbed) -> None:
    r = shell(cli, "alice", f"{DOCKER} run --rm --privileged {BED_RUN} {IMAGE} true; "
              f"{DOCKER} run --rm --cgroup-parent=/ {BED_RUN} {IMAGE} true; "
              f"{DOCKER} run --rm -v $HOME/.ssh:/x {BED_RUN} {IMAGE} true; echo end")
    assert "end" in r.stdout, (r.stdout, r.stderr)
    err = r.stderr
    assert "Error response from daemon: leviathd: privileged containers are not allowed" in err
    assert "leviathd: --cgroup-parent is not allowed" in err, err
    assert "leviathd: bind of" in err, err


def test_docker_ps_shows_only_its_own_and_a_second_agent_sees_nothing(cli: Testbed) -> None:
    first = shell(cli, "alice", f"{DOCKER} run -d --name cli-own-1 {BED_RUN} {IMAGE} "
                  "sleep 300 >/dev/null && sleep 120", detach=True)
    assert first.returncode == 0, first.stderr
    agent_id = first.stdout.strip()
    try:
        deadline = time.monotonic() + 30
        while "cli-own-1" not in podman(cli, "ps", "--format", "{{.Names}}"):
            assert time.monotonic() < deadline, "the first agent's container never ran"
            time.sleep(0.3)
        for user in ("alice", "bob"):
            r = shell(cli, user, f"{DOCKER} run -d --name cli-mine-{user} {BED_RUN} {IMAGE} "
                      f"sleep 30 >/dev/null; {DOCKER} ps -a --format '{{{{.Names}}}}'; "
                      f"{DOCKER} inspect cli-own-1 >/dev/null 2>&1 || echo inspect-refused; "
                      # (rm -f says nothing of a container it does not find)
                      f"{DOCKER} rm -f cli-own-1 >/dev/null 2>&1; "
                      f"{DOCKER} stop -t 0 cli-own-1 >/dev/null 2>&1 || echo stop-refused")
            assert r.returncode == 0, (r.stdout, r.stderr)
            names = [ln for ln in r.stdout.splitlines() if ln.startswith("cli-")]
            assert names == [f"cli-mine-{user}"], r.stdout
            for word in ("inspect-refused", "stop-refused"):
                assert word in r.stdout, (user, r.stdout, r.stderr)
        assert "cli-own-1" in podman(cli, "ps", "--format", "{{.Names}}")
    finally:
        cli.run(["lev", "stop", agent_id], user="alice", check=False)
    assert _wait_gone(cli, agent_id) == []


def test_docker_compose_up_of_two_services(cli: Testbed) -> None:
    r = shell(cli, "alice", f"{DOCKER} compose -p stack up -d && "
              f"{DOCKER} compose -p stack ps --format '{{{{.Service}}}} {{{{.State}}}}' && "
              f"{DOCKER} ps --format '{{{{.Names}}}}' | sort && "
              f"{DOCKER} compose -p stack down -t 0 && echo down-ok",
              cwd="engine-work/stack")
    assert r.returncode == 0, (r.stdout, r.stderr)
    out = r.stdout
    assert "web running" in out and "db running" in out, (out, r.stderr)
    assert "stack-db-1\nstack-web-1" in out, out
    assert "down-ok" in out, (out, r.stderr)
    assert "stack-" not in podman(cli, "ps", "-a", "--format", "{{.Names}}")


def test_docker_build_and_cp_both_ways_through_the_rebuilt_requests(cli: Testbed) -> None:
    # Issue 29: the query of a legacy build and the archive endpoints of cp
    # pass the allow-lists; what the engine got is the model's, not ours.
    home = cli.users["alice"].home
    cli.run(["mkdir", "-p", f"{home}/engine-work/ctx"], user="alice")
    cli.write_file(f"{home}/engine-work/ctx/Dockerfile",
                   f"FROM {IMAGE}\nCOPY hello.txt /hello.txt\nLABEL made=by-build\n")
    cli.write_file(f"{home}/engine-work/ctx/hello.txt", "hello from the context\n")
    cli.run(["chown", "-R", "alice", f"{home}/engine-work/ctx"])
    r = shell(cli, "alice", "set -e; "
              f"DOCKER_BUILDKIT=0 {DOCKER} build -q -t localhost/rb-built:1 --build-arg A=1 "
              "--label l=v ctx >/dev/null; "
              f"{DOCKER} run --rm {BED_RUN} localhost/rb-built:1 cat /hello.txt; "
              f"{DOCKER} run -d --name cp-1 {BED_RUN} {IMAGE} sleep 300 >/dev/null; "
              "echo into the container > in.txt; "
              f"{DOCKER} cp in.txt cp-1:/tmp/in.txt; "
              f"{DOCKER} cp cp-1:/tmp/in.txt out.txt; cat out.txt; "
              f"{DOCKER} rm -f cp-1 >/dev/null; {DOCKER} rmi localhost/rb-built:1 >/dev/null; "
              "echo done")
    try:
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "hello from the context" in r.stdout, (r.stdout, r.stderr)
        assert "into the container" in r.stdout and "done" in r.stdout, (r.stdout, r.stderr)
    finally:
        cli.run(["podman", "rm", "-f", "cp-1"], check=False)
        cli.run(["podman", "rmi", "-f", "localhost/rb-built:1"], check=False)
