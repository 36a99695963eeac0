"""Issue 49, items 2 and 6: the common clients on an agent's filtered engine
socket, typed as a user types them (no `--runtime`, `--network` or
`--ulimit` added), inside one real agent whose engine is its user's rootless
podman (the default with `[sandbox.containers] enabled = true`):

- Debian's docker CLI 26 and compose v2 (scripts/setup's), and the docker
  CLI 28.2.2 that is this machine's `docker` (copied into the bed), whose
  create body carries `GwPriority` (a field the model does not know, at its
  zero: dropped, issue 49);
- `podman --remote` (the bed's podman 4.3): ping, `ps` and `images` pass;
  `run` is refused with the reason;
- `docker logs` of a container made with no log driver (podman's file
  driver: its journald reader fails on Debian 13);
- a healthcheck, run by the daemon's timer on the engine, in the agent's
  scope, at the 10 s floor (issue 49, item 5);
- what cannot work because the agent's containers share the agent's own
  network namespace (the bed's agents are behind the proxy: only lo, out
  through the agent's proxy; test_engine_egress.py shows it): `-p` and
  compose's default network, refused naming why.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from test_engine_rootless import IMAGE, TARBALL, bed, cli  # noqa: F401
from test_engine_socket_cli import DOCKER
from testbed import Testbed

pytestmark = pytest.mark.testbed

# The machine's docker CLI, at a path of the bed's that no other test uses.
DOCKER_NEW = "/usr/local/lib/leviath-test/docker"
COMPOSE = f"""services:
  web:
    image: {IMAGE}
    command: ["sh", "-c", "echo web-says-hi; sleep 300"]
    network_mode: none
"""
DEFAULT_NET_COMPOSE = f"""services:
  app:
    image: {IMAGE}
    command: ["true"]
"""


def _host_docker() -> tuple[str, str]:
    path = shutil.which("docker") or ""
    if not path:
        pytest.skip("no docker CLI on this machine's PATH (issue 49 names its 28.2.2)")
    out = subprocess.run([path, "version", "--format", "{{.Client.Version}}"],
                         capture_output=True, text=True, timeout=30, check=False).stdout
    return path, out.strip()


@pytest.fixture(scope="module")
def clients(cli: Testbed) -> tuple[Testbed, str]:  # noqa: F811
    path, version = _host_docker()
    cli.copy_in(path, DOCKER_NEW, mode=0o755)
    work = f"{cli.users['alice'].home}/rootless-work"
    for name, text in (("plain", COMPOSE), ("defnet", DEFAULT_NET_COMPOSE)):
        cli.run(["mkdir", "-p", f"{work}/{name}"], user="alice")
        cli.write_file(f"{work}/{name}/compose.yaml", text)
    cli.run(["chown", "-R", "alice:", work])
    return cli, version


SCRIPT = f"""
D26={DOCKER}; DN={DOCKER_NEW}
echo "host=$DOCKER_HOST"
echo "v26=$($D26 version --format '{{{{.Client.Version}}}} {{{{.Server.APIVersion}}}}')"
echo "vnew=$($DN version --format '{{{{.Client.Version}}}} {{{{.Client.APIVersion}}}}')"
$D26 import {TARBALL} {IMAGE} >/dev/null || echo import-failed
$D26 run --name r26 {IMAGE} sh -c 'echo plain-run-26; exit 3'; echo "r26=$?"
$DN run --name rnew {IMAGE} sh -c 'echo plain-run-new; exit 4'; echo "rnew=$?"
$DN run -d --name bg {IMAGE} sh -c 'echo from-the-logs; sleep 300' >/dev/null
i=0; until $DN logs bg 2>&1 | grep -q from-the-logs || [ $i -ge 300 ]; do
  i=$((i+1)); sleep 0.1; done
echo "logs-new=$($DN logs bg 2>&1)"
echo "logs-26=$($D26 logs bg 2>&1)"
echo "ps=$($DN ps --format '{{{{.Names}}}}' | sort | tr '\\n' ,)"
echo "inspect=$($DN inspect -f '{{{{.State.Status}}}} {{{{.HostConfig.LogConfig.Type}}}} \
{{{{.HostConfig.NetworkMode}}}}' bg)"
echo "podman-ps=$(podman --remote --url "$DOCKER_HOST" ps -a --format '{{{{.Names}}}}' \
  | sort | tr '\\n' ,)"
echo "podman-version=$(podman --remote --url "$DOCKER_HOST" version --format \
'{{{{.Client.Version}}}} {{{{.Server.Version}}}}')"
echo "podman-images=$(podman --remote --url "$DOCKER_HOST" images --format \
'{{{{.Repository}}}}' | tr '\\n' ,)"
podman --remote --url "$DOCKER_HOST" run --rm {IMAGE} true; echo "podman-run=$?"
$DN run --rm -p 8080:80 {IMAGE} true; echo "publish=$?"
(cd plain && $D26 compose -p plain up -d 2>/dev/null && echo compose-up-ok
 i=0; until $D26 compose -p plain logs web 2>&1 | grep -q web-says-hi || [ $i -ge 300 ]; do
   i=$((i+1)); sleep 0.1; done
 $D26 compose -p plain logs --no-log-prefix web; $D26 compose -p plain down -t 0 2>/dev/null \
   && echo compose-down-ok)
(cd defnet && $D26 compose -p defnet up 2>&1; echo "defnet=$?"; \
 $D26 compose -p defnet down -t 0 >/dev/null 2>&1)
$DN run -d --name hc --health-cmd 'cat /proc/self/cgroup > /tmp/hc-cgroup' \
  --health-interval 1s {IMAGE} sleep 300 >/dev/null
i=0; until [ "$($DN inspect -f '{{{{.State.Health.Status}}}}' hc)" = healthy ] || [ $i -ge 900 ]; do
  i=$((i+1)); sleep 0.1; done
echo "health=$($DN inspect -f \
  '{{{{.State.Health.Status}}}} {{{{.Config.Healthcheck.Interval}}}}' hc)"
echo "hc-cgroup=$($DN exec hc cat /tmp/hc-cgroup | tr '\n' ' ')"
echo "my-cgroup=$(tr '\n' ' ' < /proc/self/cgroup)"
$DN rm -f r26 rnew bg hc >/dev/null
echo "left=$($DN ps -a -q | wc -l)"
"""


def _value(out: str, key: str) -> str:
    for line in out.splitlines():
        if line.startswith(key + "="):
            return line[len(key) + 1:]
    raise AssertionError(f"no {key}= in:\n{out}")


def test_the_common_clients_work_as_typed_and_what_cannot_says_why(
        clients: tuple[Testbed, str]) -> None:
    tb, version = clients
    home = tb.users["alice"].home
    r = tb.run(["lev", "run", "--", "sh", "-c", SCRIPT], user="alice",
                cwd=f"{home}/rootless-work", check=False, timeout=400)
    out, err = r.stdout, r.stderr
    assert r.returncode == 0, (out, err)
    assert _value(out, "host") == "unix:///run/leviath/engine.sock", out
    # The versions the clients negotiated with the engine through the socket.
    assert _value(out, "v26").startswith("26."), out
    assert _value(out, "vnew").startswith(version + " 1.41"), out
    assert "import-failed" not in out, err
    # `docker run IMAGE cmd`, attached, each CLI: output and exit status.
    assert "plain-run-26" in out and _value(out, "r26") == "3", (out, err)
    assert "plain-run-new" in out and _value(out, "rnew") == "4", (out, err)
    assert "GwPriority" not in err, err
    # -d, logs (both CLIs), ps, inspect.
    assert _value(out, "logs-new") == "from-the-logs", (out, err)
    assert _value(out, "logs-26") == "from-the-logs", (out, err)
    assert _value(out, "ps") == "bg,", out
    # (podman's compat inspect names its k8s-file driver json-file; journald
    # would read journald; the agent's own network namespace is the engine's host network)
    assert _value(out, "inspect") in ("running json-file host", "running k8s-file host"), out
    # podman --remote: its own API's ping and lists, its run refused saying why.
    assert _value(out, "podman-ps") == "bg,r26,rnew,", (out, err)
    assert _value(out, "podman-version").startswith("4.3"), (out, err)
    assert "localhost/leviath-rootless-busybox" in _value(out, "podman-images"), (out, err)
    assert _value(out, "podman-run") != "0", out
    assert "podman's own API (libpod) is not filtered" in err, err
    assert "use the docker CLI or compose" in err, err
    # The agent's network is the containers': what needs one of their own says why.
    assert _value(out, "publish") != "0", out
    assert "publishing a port is not possible here" in err, err
    assert "the agent's containers share its network namespace" in err, err
    assert "compose-up-ok" in out and "web-says-hi" in out, (out, err)
    assert "compose-down-ok" in out, (out, err)
    assert _value(out, "defnet") != "0", out
    assert "network defnet_default cannot carry a container here" in out, out
    # Healthchecks run (item 5): at the floor's interval, not the 1 s asked, and
    # the check's process is in the agent's scope in every hierarchy where the
    # agent's shell is.
    assert _value(out, "health") == "healthy 10s", out
    checked = set(_value(out, "hc-cgroup").split())
    mine = [e for e in _value(out, "my-cgroup").split() if e.endswith(".scope")]
    assert mine and all(e in checked for e in mine), out
    assert _value(out, "left") == "0", out


# Debian unstable's docker CLI and compose (scripts/setup: whatever sid had
# when fetched, 28.5 and 2.40 when this was written), at paths of the bed's
# that no other test uses; compose as the CLI's plugin through DOCKER_CONFIG.
SID = "/opt/leviath-dev/docker/sid"
DOCKER_SID = "/usr/local/lib/leviath-test/sid/docker"
SID_CONFIG = "/usr/local/lib/leviath-test/sid/config"

SID_SCRIPT = f"""
export DOCKER_CONFIG={SID_CONFIG}; D={DOCKER_SID}
echo "v=$($D version --format '{{{{.Client.Version}}}} {{{{.Client.APIVersion}}}}')"
echo "vc=$($D compose version --short)"
$D import {TARBALL} {IMAGE} >/dev/null || echo import-failed
$D run --name r {IMAGE} sh -c 'echo plain-run-sid; exit 5'; echo "r=$?"
$D run -d --name bg {IMAGE} sh -c 'echo from-the-logs; sleep 300' >/dev/null
i=0; until $D logs bg 2>&1 | grep -q from-the-logs || [ $i -ge 300 ]; do
  i=$((i+1)); sleep 0.1; done
echo "logs=$($D logs bg 2>&1)"
echo "exec=$($D exec bg sh -c 'echo exec-in-$((6*7))')"
echo copied-in > in.txt && $D cp in.txt bg:/tmp/in.txt && $D exec bg cat /tmp/in.txt
$D cp bg:/etc/passwd out.txt && echo "cp-out=$(head -c 4 out.txt)"
echo "ps=$($D ps --format '{{{{.Names}}}}' | sort | tr '\\n' ,)"
echo "inspect=$($D inspect -f '{{{{.State.Status}}}}' bg)"
$D volume create vsid >/dev/null && echo "volumes=$($D volume ls -q | tr '\\n' ,)"
$D run --rm -v vsid:/v {IMAGE} sh -c 'echo in-volume > /v/f' && \
  echo "volume-read=$($D run --rm -v vsid:/v {IMAGE} cat /v/f)"
$D network create nsid >/dev/null && \
  echo "networks=$($D network ls --format '{{{{.Name}}}}' | sort | tr '\\n' ,)"
$D network rm nsid >/dev/null
(cd plain && $D compose -p plain up -d 2>/dev/null && echo compose-up-ok
 i=0; until $D compose -p plain logs web 2>&1 | grep -q web-says-hi || [ $i -ge 300 ]; do
   i=$((i+1)); sleep 0.1; done
 $D compose -p plain logs --no-log-prefix web; $D compose -p plain down -t 0 2>/dev/null \
   && echo compose-down-ok)
$D rm -f r bg >/dev/null; $D volume rm vsid >/dev/null
echo "left=$($D ps -a -q | wc -l) $($D volume ls -q | wc -l)"
"""


@pytest.fixture(scope="module")
def sid_clients(clients: tuple[Testbed, str]) -> Testbed:
    tb = clients[0]
    for rel, where in (("bin/docker", DOCKER_SID),
                       ("config/cli-plugins/docker-compose",
                        f"{SID_CONFIG}/cli-plugins/docker-compose")):
        if not os.access(f"{SID}/{rel}", os.X_OK):
            pytest.fail(f"{SID}/{rel} is missing: run scripts/setup (it fetches sid's)")
        tb.copy_in(f"{SID}/{rel}", where, mode=0o755)
    return tb


def test_debian_unstables_docker_cli_and_compose_work_as_typed(sid_clients: Testbed) -> None:
    """The newest Debian docker CLI and compose (sid's), typed as a user
    types them: run attached with its exit status, -d and logs, exec, cp
    both ways, ps, inspect, a named volume, network create/ls/rm, compose
    up/logs/down."""
    tb = sid_clients
    home = tb.users["alice"].home
    r = tb.run(["lev", "run", "--", "sh", "-c", SID_SCRIPT], user="alice",
               cwd=f"{home}/rootless-work", check=False, timeout=400)
    out, err = r.stdout, r.stderr
    assert r.returncode == 0, (out, err)
    version, api = _value(out, "v").split()
    print(f"sid's docker CLI {version} (API {api}), compose {_value(out, 'vc')}")
    assert int(version.split(".")[0]) >= 28 and api == "1.41", out
    assert "import-failed" not in out, err
    assert "plain-run-sid" in out and _value(out, "r") == "5", (out, err)
    assert _value(out, "logs") == "from-the-logs", (out, err)
    assert _value(out, "exec") == "exec-in-42", (out, err)
    assert "copied-in" in out.splitlines() and _value(out, "cp-out") == "root", (out, err)
    assert _value(out, "ps") == "bg,", out
    assert _value(out, "inspect") == "running", out
    assert "vsid," in _value(out, "volumes") and _value(out, "volume-read") == "in-volume", (
        out, err)
    # (the list shows the agent's own networks: the engine's default is not
    # one, its containers share the agent's network namespace)
    assert _value(out, "networks") == "nsid,", (out, err)
    assert "compose-up-ok" in out and "web-says-hi" in out, (out, err)
    assert "compose-down-ok" in out, (out, err)
    assert _value(out, "left") == "0 0", out


def test_the_bed_has_the_clients_it_names() -> None:
    # What this file's docstring names exists where the fixtures take it.
    assert os.access("/opt/leviath-dev/docker/bin/docker", os.X_OK) or os.environ.get(
        "LEVIATH_DOCKER_DIR"), "scripts/setup fetches Debian's docker CLI"
