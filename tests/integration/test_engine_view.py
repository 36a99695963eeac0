"""The agent's container engine sees what the agent sees (issue 43, items 1
and 2), from the attacker's side: from inside alice's agent, with the docker
CLI on $DOCKER_HOST. A build's RUN step that climbs out of buildah's cache
folder (`--mount=type=cache,id=../..`, CVE-2024-9675 in the buildah Debian
ships) or binds `/` (`--mount=type=bind,source=/`) gets the engine's root:
before, the machine's (alice's hidden ~/.ssh key, her home, bob's 0600 file,
her /run/user folder); now the agent's own view. A container's bind of the
workdir carries the fence's read-only `.git/config`, and `docker cp` into a
container cannot write its bind of the read-only ~/.local/bin. buildah's
shared /var/tmp/buildah-cache is the agent's own /tmp now: bob's build runs
nothing alice planted there. After `lev stop`, no process of alice's is left,
nor anything she made in /var/tmp.
"""

from __future__ import annotations

import hashlib
import os
import time

import pytest
from test_engine_rootless import IMAGE, TARBALL, bed  # noqa: F401
from test_engine_socket_cli import BED_RUN, DOCKER, DOCKER_DIR
from testbed import Testbed

pytestmark = pytest.mark.testbed

WORK = "view-work"

# {probe} is replaced per run: what a RUN step tries to read from the root it got.
DOCKERFILE = f"""FROM {IMAGE}
RUN --mount=type=cache,id=../../../../../../../../..,target=/host,uid=0 sh -c 'R=/host; {{probe}}; echo cache-probe""-done'
RUN --mount=type=cache,id=pipcache,target=/c,uid=0 sh -c 'chmod 777 /c; echo "echo ALICE-CODE-RAN" > /c/run.sh; chmod 777 /c/run.sh; echo planted'
"""  # noqa: E501
# The engine may refuse this one (a bind of its whole root): it must leak nothing either way.
BIND_DOCKERFILE = f"""FROM {IMAGE}
RUN --mount=type=bind,source=/,target=/host sh -c 'R=/host; {{probe}}; echo bind-probe""-done'
"""
# buildah's bind `from=` a stage follows a link in it on the engine's side
# (CVE-2024-1753, in the buildah Debian 12 ships): a link to `/` mounts the
# engine's root.
FROM_DOCKERFILE = f"""FROM {IMAGE} AS link
RUN ln -s / /rootlink
FROM {IMAGE}
RUN --mount=type=bind,from=link,source=/rootlink,target=/host sh -c 'R=/host; {{probe}}; echo from-probe""-done'
"""  # noqa: E501
# A secret's `src` in the Dockerfile, and an ssh agent's mount: the classic
# builder may refuse either; neither may hand a hidden file to the step.
SECRET_DOCKERFILE = f"""FROM {IMAGE}
RUN --mount=type=secret,id=x,src={{key}},target=/s sh -c 'cat /s /run/secrets/x; echo secret-probe""-done'
"""  # noqa: E501
SSH_DOCKERFILE = f"""FROM {IMAGE}
RUN --mount=type=ssh sh -c 'ls -la $SSH_AUTH_SOCK /run/buildkit; echo ssh-probe""-done'
"""
BOB_DOCKERFILE = f"""FROM {IMAGE}
RUN --mount=type=cache,id=pipcache,target=/c,uid=0 sh -c 'ls -la /c; [ ! -f /c/run.sh ] || sh /c/run.sh; echo bob-build-done'
"""  # noqa: E501


@pytest.fixture(scope="module")
def view(bed: Testbed) -> Testbed:  # noqa: F811
    docker = f"{DOCKER_DIR}/bin/docker"
    if not os.access(docker, os.X_OK):
        pytest.skip(f"no docker CLI in {DOCKER_DIR} (scripts/setup fetches it)")
    bed.run(["install", "-D", "-m", "0755", docker, DOCKER])
    for user in ("alice", "bob"):
        home = bed.users[user].home
        work = f"{home}/{WORK}"
        bed.run(["mkdir", "-p", *(f"{work}/{c}" for c in ("ctx", "ctx-bind", "ctx-from",
                                                          "ctx-secret", "ctx-ssh"))], user=user)
        bed.run(["cp", f"{home}/rootless-work/{TARBALL}", f"{work}/{TARBALL}"])
        bed.run(["git", "init", "-q", work], user=user)
        bed.run(["mkdir", "-p", f"{home}/.local/bin"], user=user)
        bed.run(["chown", "-R", f"{user}:", work])
    return bed


def _secrets(tb: Testbed) -> dict[str, str]:
    """What alice's agent cannot read, planted on the host: name -> text."""
    alice, bob = tb.users["alice"], tb.users["bob"]
    found = {}
    for name, path, owner in (
        ("ssh key", f"{alice.home}/.ssh/id_rsa", alice),
        ("home marker", f"{alice.home}/leviath-marker-outside", alice),
        ("bob's file", f"{bob.home}/leviath-secret-view", bob),
        ("runtime marker", f"/run/user/{alice.uid}/leviath-marker", alice),
    ):
        text = f"{name.replace(' ', '-')}-{os.urandom(6).hex()}"
        tb.run(["mkdir", "-p", os.path.dirname(path)])
        tb.write_file(path, text + "\n", mode=0o600)
        tb.run(["chown", f"{owner.name}:", path])
        found[name] = text
    # A stand-in for alice's session bus (the bed runs no `systemd --user` of
    # hers): a socket where hers would be, the path a RUN step dialled to make
    # a unit that outlived her agent.
    tb.run(["python3", "-c", "import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])",
            f"/run/user/{alice.uid}/bus"])
    tb.run(["chown", "alice:", f"{alice.home}/.ssh", f"/run/user/{alice.uid}",
            f"/run/user/{alice.uid}/bus"])
    tb.run(["chmod", "700", f"{alice.home}/.ssh", f"/run/user/{alice.uid}"])
    return found


def _probe(tb: Testbed) -> str:
    alice, bob = tb.users["alice"], tb.users["bob"]
    reads = [f"{alice.home}/.ssh/id_rsa", f"{alice.home}/leviath-marker-outside",
             f"{bob.home}/leviath-secret-view", f"/run/user/{alice.uid}/leviath-marker"]
    # `$R` is the root the step got; every read is tried, whatever fails.
    rundir = f"/run/user/{alice.uid}"
    return ("for f in " + " ".join(reads) + "; do cat $R$f; done 2>/dev/null; "
            f"[ ! -e $R{rundir} ] || echo runtime-dir\"\"-seen; "
            f"[ ! -S $R{rundir}/bus ] || echo session-bus\"\"-seen; true")


def _var_tmp(tb: Testbed) -> set[str]:
    """alice's entries in the machine's /var/tmp: her engine's buildah-cache-0
    and api_load.tar* are hers on the host (root in her user namespace). Only
    hers: the bed's /var/tmp also shows the host's, where other beds' root
    engines make and remove entries of the same names at any time."""
    return set(tb.run(["find", "/var/tmp", "-mindepth", "1", "-maxdepth", "1", "-user",
                       "alice"]).stdout.split())


def _sha(tb: Testbed, path: str) -> str:
    return hashlib.sha256(tb.run(["cat", path]).stdout.encode()).hexdigest()


def test_builds_and_binds_reach_only_what_the_agent_sees_and_nothing_outlives_it(
        view: Testbed) -> None:
    alice = view.users["alice"]
    work = f"{alice.home}/{WORK}"
    secrets = _secrets(view)
    probe = _probe(view)
    view.write_file(f"{work}/ctx/Dockerfile", DOCKERFILE.replace("{probe}", probe))
    view.write_file(f"{work}/ctx-bind/Dockerfile", BIND_DOCKERFILE.replace("{probe}", probe))
    view.write_file(f"{work}/ctx-from/Dockerfile", FROM_DOCKERFILE.replace("{probe}", probe))
    key = f"{alice.home}/.ssh/id_rsa"
    view.write_file(f"{work}/ctx-secret/Dockerfile", SECRET_DOCKERFILE.replace("{key}", key))
    view.write_file(f"{work}/ctx-ssh/Dockerfile", SSH_DOCKERFILE)
    view.write_file(f"{work}/evil.cfg", "[core]\n\thooksPath = /tmp/evil\n")
    view.run(["chown", "-R", "alice:", work])
    config = f"{work}/.git/config"
    config_before = _sha(view, config)
    var_tmp_before = _var_tmp(view)
    done = f"{work}/probes.done"
    view.run(["rm", "-f", done, f"{work}/probes.out"])
    script = f"""exec > probes.out 2>&1
D={DOCKER}
$D import {TARBALL} {IMAGE} >/dev/null && echo import-ok
DOCKER_BUILDKIT=0 $D build --no-cache -t localhost/view-probe:1 ctx \\
    && echo build-ok
DOCKER_BUILDKIT=0 $D build --no-cache ctx-bind
DOCKER_BUILDKIT=0 $D build --no-cache ctx-from
DOCKER_BUILDKIT=0 $D build --no-cache ctx-secret
DOCKER_BUILDKIT=0 $D build --no-cache --secret id=x,src={key} ctx-secret
DOCKER_BUILDKIT=0 $D build --no-cache ctx-ssh
# What the CLI cannot send without BuildKit, sent raw: podman's /build reads
# `secrets` (a file of the engine's side) from the query.
tar -C ctx-secret -cf secret.tar Dockerfile
curl -sS --unix-socket "${{DOCKER_HOST#unix://}}" -H 'Content-Type: application/x-tar' \
    --data-binary @secret.tar \
    "http://d/build?networkmode=none&secrets=%5B%22id%3Dx%2Csrc%3D{key.replace('/', '%2F')}%22%5D"
echo raw-secret-done
$D run --rm {BED_RUN} -v "$PWD:/w" {IMAGE} sh -c \\
    'echo "[core] hooksPath = /tmp/evil" >> /w/.git/config && echo container-wrote-config'
$D create --name cpc {BED_RUN} -v "$HOME/.local/bin:/lb" {IMAGE} true >/dev/null \\
    && echo created
$D cp evil.cfg cpc:/lb/evil-tool && echo cp-wrote-tool
$D rm cpc >/dev/null
$D run -d {BED_RUN} {IMAGE} sleep 3171 >/dev/null && echo left-running
touch probes.done
sleep 600
"""
    r = view.run(["lev", "run", "--detach", "--", "sh", "-c", script], user="alice",
                 cwd=work, check=False, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    agent_id = r.stdout.strip()
    try:
        deadline = time.monotonic() + 400
        while view.run(["test", "-e", done], check=False).returncode != 0:
            assert time.monotonic() < deadline, view.run(["cat", f"{work}/probes.out"],
                                                         check=False).stdout
            time.sleep(0.5)
        out = view.run(["cat", f"{work}/probes.out"]).stdout
        # The steps ran (a build that failed early would show nothing either).
        for word in ("import-ok", "cache-probe-done", "build-ok", "raw-secret-done", "created",
                     "left-running"):
            assert word in out, (word, out)
        for name, text in secrets.items():
            assert text not in out, f"a RUN step read {name}: {out}"
        # alice's runtime folder and session bus are not in the engine's view.
        assert "runtime-dir-seen" not in out, out
        assert "session-bus-seen" not in out, out
        # The fence's read-only .git/config stays so in a bind, and to docker cp.
        assert "container-wrote-config" not in out, out
        assert "cp-wrote-tool" not in out, out
        assert _sha(view, config) == config_before
        assert view.run(["test", "-e", f"{alice.home}/.local/bin/evil-tool"],
                        check=False).returncode != 0
    finally:
        view.run(["lev", "stop", agent_id], user="alice", check=False)
    # Nothing of alice's runs after the stop: not the engine, not the
    # container left running, not a unit of hers.
    deadline = time.monotonic() + 90
    while True:
        left = view.run(["ps", "-u", str(alice.uid), "-o", "pid=,args="],
                        check=False).stdout.strip()
        if not left:
            break
        assert time.monotonic() < deadline, f"alice's processes outlived lev stop: {left}"
        time.sleep(0.5)
    # Nothing the build or the import made stays in the machine's /var/tmp.
    assert _var_tmp(view) - var_tmp_before == set()


def test_bobs_build_runs_nothing_alice_planted_in_buildahs_cache(view: Testbed) -> None:
    bob = view.users["bob"]
    work = f"{bob.home}/{WORK}"
    view.write_file(f"{work}/ctx/Dockerfile", BOB_DOCKERFILE)
    view.run(["chown", "-R", "bob:", work])
    script = f"""set -e
{DOCKER} import {TARBALL} {IMAGE} >/dev/null
DOCKER_BUILDKIT=0 {DOCKER} build --no-cache ctx 2>&1
"""
    r = view.run(["lev", "run", "--", "sh", "-c", script], user="bob", cwd=work,
                 check=False, timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "bob-build-done" in r.stdout, r.stdout
    assert "ALICE-CODE-RAN" not in r.stdout, r.stdout


def _fence_pid1(tb: Testbed, uid: int) -> int:
    """The agent's fence's PID 1: alice's process that is PID 1 of a PID
    namespace one level below the bed's, and not the container's sleep."""
    out = tb.run(["sh", "-c", f"for p in $(ps -u {uid} -o pid=); do "
                  "echo $p $(grep NSpid /proc/$p/status) $(tr '\\0' ' ' </proc/$p/cmdline);"
                  " done"], check=False).stdout
    found = [int(f[0]) for f in (ln.split() for ln in out.splitlines())
             if len(f) >= 4 and f[1] == "NSpid:" and f[3] == "1" and f[4:6] != ["sleep", "3174"]]
    assert len(found) == 1, out
    return found[0]


def test_an_agent_whose_pid1_is_killed_while_the_daemon_is_down_leaves_no_engine(
        view: Testbed) -> None:
    # Nobody stops the scope then: the engine itself must end with the fence.
    alice = view.users["alice"]
    work = f"{alice.home}/{WORK}"
    done = f"{work}/killed.done"
    view.run(["rm", "-f", done])
    script = f"""{DOCKER} import {TARBALL} {IMAGE} >/dev/null
{DOCKER} run -d {BED_RUN} {IMAGE} sleep 3174 >/dev/null && touch killed.done
sleep 600
"""
    r = view.run(["lev", "run", "--detach", "--", "sh", "-c", script], user="alice",
                 cwd=work, check=False, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    agent_id = r.stdout.strip()
    storage = f"/var/lib/leviath/engine-storage/{agent_id}"
    try:
        deadline = time.monotonic() + 300
        while view.run(["test", "-e", done], check=False).returncode != 0:
            assert time.monotonic() < deadline, "the agent never ran its container"
            time.sleep(0.5)
        pid1 = _fence_pid1(view, alice.uid)
        view.run(["systemctl", "stop", "leviathd"])
        view.run(["kill", "-KILL", str(pid1)])
        deadline = time.monotonic() + 60
        while True:
            left = view.run(["ps", "-u", str(alice.uid), "-o", "pid=,args="],
                            check=False).stdout.strip()
            if not left:
                break
            assert time.monotonic() < deadline, f"alice's engine outlived her fence: {left}"
            time.sleep(0.5)
    finally:
        view.run(["systemctl", "start", "leviathd"], check=False)
        view.run(["lev", "stop", agent_id], user="alice", check=False)
    # The next daemon sweeps what is left: files only.
    deadline = time.monotonic() + 60
    while view.run(["test", "-e", storage], check=False).returncode == 0:
        assert time.monotonic() < deadline, "the restarted daemon never swept the storage"
        time.sleep(0.5)
