"""Images kept per user (issue 49, item 4; leviathd/enginesock/imagestore.py),
from inside real agents in the test bed, typed as a user types them with
the docker CLI: what alice's agent imported is there for her next agent,
never for bob's; what one agent of alice removes does not leave the store
or another of her agents; the store's size bound removes the oldest.

No registry: the images are `docker import`s of tarballs of the bed's
static busybox (as test_engine_rootless.py makes them).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from test_engine_rootless import MAKE_TARBALL
from test_engine_socket_cli import DOCKER, DOCKER_DIR
from testbed import Testbed

pytestmark = pytest.mark.testbed

CONFIG = """[sandbox]
kind = "namespace"
[sandbox.containers]
enabled = true
"""
SMALL = CONFIG + 'image_store_max = "3M"\n'
WORK = "images-work"


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    docker = f"{DOCKER_DIR}/bin/docker"
    if not os.access(docker, os.X_OK):
        pytest.skip(f"no docker CLI in {DOCKER_DIR} (scripts/setup fetches it)")
    testbed.run(["install", "-D", "-m", "0755", docker, DOCKER])
    for user in ("alice", "bob"):
        home = testbed.users[user].home
        testbed.run(["mkdir", "-p", WORK], user=user, cwd=home)
        for name in ("bb.tar", "bb2.tar"):
            r = testbed.run(["sh", "-c", MAKE_TARBALL, "sh", f"{home}/{WORK}/{name}"],
                            check=False, timeout=180)
            if r.returncode == 3:
                pytest.skip(r.stderr.strip())
            assert r.returncode == 0, r.stderr
        # The second image differs in one file: a layer of its own.
        testbed.run(["sh", "-c", f"cd {home}/{WORK} && mkdir -p x/etc && echo two > "
                     "x/etc/which && tar -rf bb2.tar -C x ./etc/which && rm -rf x"])
        testbed.run(["chown", "-R", f"{user}:", f"{home}/{WORK}"])
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    testbed.run(["systemctl", "restart", "leviathd"])
    yield testbed
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "restart", "leviathd"])
    # The bed is the session's: later modules' agents start with no kept images.
    testbed.run(["rm", "-rf", "/var/lib/leviath/image-store"])


def in_agent(bed: Testbed, user: str, script: str) -> str:
    """`script` in a new agent of `user` (which ends when it does); its output."""
    home = bed.users[user].home
    r = bed.run(["lev", "run", "--", "sh", "-c", script], user=user, cwd=f"{home}/{WORK}",
                check=False, timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r.stdout


def _wait(bed: Testbed, path: str, seconds: float = 240) -> None:
    """Until `path` exists (an agent's step that is done), or fails."""
    deadline = time.monotonic() + seconds
    while bed.run(["test", "-e", path], check=False).returncode != 0:
        assert time.monotonic() < deadline, f"{path} never came"
        time.sleep(0.3)


IMAGES = f"{DOCKER} images --format '{{{{.Repository}}}}:{{{{.Tag}}}}' | sort"


def test_an_image_alice_imported_is_her_next_agents_and_never_bobs(bed: Testbed) -> None:
    out = in_agent(bed, "alice", f"{DOCKER} import bb.tar localhost/kept:1 >/dev/null && "
                   f"echo imported")
    assert "imported" in out, out
    # Her next agent: listed, and it runs.
    out = in_agent(bed, "alice", f"{IMAGES}; {DOCKER} run --rm localhost/kept:1 "
                   "echo ran-kept")
    assert "localhost/kept:1" in out and "ran-kept" in out, out
    # Bob's agent: not listed, and not runnable (nothing to pull it from).
    out = in_agent(bed, "bob", f"{IMAGES}; echo ---; {DOCKER} run --rm "
                   "localhost/kept:1 echo ran-kept 2>&1 || echo run-failed")
    listed, _, ran = out.partition("---\n")
    assert "localhost/kept" not in listed, out
    assert "ran-kept" not in ran.replace("echo ran-kept", "") and "run-failed" in ran, out
    # Listed by alice outside any agent with the flags docs/containers.md gives.
    store = f"/var/lib/leviath/image-store/{bed.users['alice'].uid}"
    flags = (f"--root {store}/storage --runroot {store}/run --tmpdir {store}/libpod-tmp "
             f"--volumepath {store}/volumes")
    # In a scope of its own, stopped after: rootless podman leaves its pause
    # process (catatonit -P) running as alice, which later modules would
    # take for something an agent left.
    scope = "leviath-test-store-list.scope"
    try:
        r = bed.run(["systemd-run", "--quiet", "--scope", f"--unit={scope}", "--uid=alice",
                     "--gid=alice", "sh", "-c",
                     "d=$(mktemp -d) && XDG_RUNTIME_DIR=$d HOME=$d podman "
                     f"{flags} images --format '{{{{.Repository}}}}:{{{{.Tag}}}}'; rm -rf $d"],
                    check=False, timeout=120)
    finally:
        bed.run(["systemctl", "stop", scope], check=False)
    assert "localhost/kept:1" in r.stdout, (r.stdout, r.stderr)
    # Nor is her store a path bob may open.
    r = bed.run(["ls", f"/var/lib/leviath/image-store/{bed.users['alice'].uid}"], user="bob",
                check=False)
    assert r.returncode != 0, r.stdout


def test_what_one_agent_removes_stays_in_the_store_and_in_her_running_agent(
        bed: Testbed) -> None:
    in_agent(bed, "alice", f"{DOCKER} import bb.tar localhost/shared:1 >/dev/null")
    home = bed.users["alice"].home
    # Agent 3 runs a container of the kept image, and waits.
    bed.run(["rm", "-f", f"{home}/{WORK}/go", f"{home}/{WORK}/held", f"{home}/{WORK}/done"])
    bed.run(["lev", "run", "--detach", "--", "sh", "-c",
                    f"{DOCKER} run -d --name held localhost/shared:1 sleep 600 "
                    f">/dev/null && touch held; while [ ! -e go ]; do sleep 0.2; done; "
                    f"{DOCKER} exec held echo still-running > held.out 2>&1; "
                    f"{IMAGES} >> held.out; {DOCKER} rm -f held >/dev/null; touch done"],
                   user="alice", cwd=f"{home}/{WORK}", timeout=120)
    _wait(bed, f"{home}/{WORK}/held")
    # Agent 2 tries to remove it (the socket's filter refuses: an agent
    # removes only the images it built; were it let through, it would be
    # agent 2's own copy), then ends.
    out = in_agent(bed, "alice", f"{DOCKER} rmi -f localhost/shared:1 >/dev/null 2>&1 && "
                   "echo removed || echo refused")
    assert "refused" in out or "removed" in out, out
    bed.run(["touch", f"{home}/{WORK}/go"], user="alice")
    _wait(bed, f"{home}/{WORK}/done")
    got = bed.run(["cat", f"{home}/{WORK}/held.out"]).stdout
    assert "still-running" in got and "localhost/shared:1" in got, got
    # The store still has it for the next agent.
    out = in_agent(bed, "alice", IMAGES)
    assert "localhost/shared:1" in out, out


def test_the_store_size_bound_removes_the_oldest(bed: Testbed) -> None:
    bed.write_file("/etc/leviath/config.toml", SMALL)
    bed.run(["systemctl", "restart", "leviathd"])
    try:
        in_agent(bed, "bob", f"{DOCKER} import bb.tar localhost/old:1 >/dev/null")
        in_agent(bed, "bob", f"{DOCKER} import bb2.tar localhost/new:1 >/dev/null")
        out = in_agent(bed, "bob", IMAGES)
        assert "localhost/new:1" in out and "localhost/old:1" not in out, out
    finally:
        bed.write_file("/etc/leviath/config.toml", CONFIG)
        bed.run(["systemctl", "restart", "leviathd"])


SECRET = "not-for-any-agent-7f3a"
# Plays a breakout's part on the agent's storage: its image's signatures
# become a link to ~/.ssh/id_test, with the size that file has. (c/image
# copies signatures as opaque bytes once their first byte passes its format
# check, 0xA3 here: an OpenPGP compressed packet, as a gpg file may start.)
PLANT = r"""
import json, os, sys
images, secret, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = os.path.join(images, "images.json")
listed = json.load(open(p))
for image in listed:
    meta = json.loads(image.get("metadata") or "{}")
    meta["signature-sizes"] = [size]
    image["metadata"] = json.dumps(meta)
    link = os.path.join(images, image["id"], "signatures")
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(secret, link)
json.dump(listed, open(p, "w"))
print("planted")
"""


def test_a_link_planted_in_an_agents_storage_copies_nothing_the_agent_could_not_read(
        bed: Testbed) -> None:
    """What a container breakout could do (it is the user, in the engine's
    view): make a piece of an image in the agent's engine storage a link to
    a file the agent's view hides (~/.ssh/id_test). Copied into the store
    where that link leads to the real file, the file's bytes would reach
    the user's next agents' storage (seen: with /home in the copy's root,
    they land in the store). The copy's root has no home, so the link leads
    nowhere. Played here by alice outside the agent, on the agent's storage,
    while the agent runs."""
    home = bed.users["alice"].home
    bed.run(["sh", "-c", f"mkdir -p {home}/.ssh && printf '\\243{SECRET}' > {home}/.ssh/id_test"
             f" && chown -R alice: {home}/.ssh && chmod 700 {home}/.ssh"])
    w = f"{home}/{WORK}"
    bed.run(["rm", "-f", f"{w}/go", f"{w}/imported"])
    agent = bed.run(["lev", "run", "--detach", "--", "sh", "-c",
                     f"{DOCKER} import bb.tar localhost/leak:1 >/dev/null && touch imported; "
                     "while [ ! -e go ]; do sleep 0.2; done"],
                    user="alice", cwd=w, timeout=120).stdout.strip().split()[-1]
    _wait(bed, f"{w}/imported")
    images = f"/var/lib/leviath/engine-storage/{agent}/storage/vfs-images"
    if bed.run(["test", "-d", images], check=False).returncode != 0:
        bed.run(["touch", f"{w}/go"], user="alice")
        pytest.skip("the engine's storage driver here is not vfs")
    r = bed.run(["python3", "-c", PLANT, images, f"{home}/.ssh/id_test",
                 str(len(SECRET) + 1)], user="alice", check=False)
    assert "planted" in r.stdout, r.stderr
    bed.run(["touch", f"{w}/go"], user="alice")
    # Until its end has copied what it could (the daemon says so).
    deadline = time.monotonic() + 240
    while True:
        said = bed.run(["journalctl", "-u", "leviathd", "--no-pager", "-o", "cat"]).stdout
        if f"agent {agent}: images kept" in said or f"agent {agent}: its images could" in said:
            break
        assert time.monotonic() < deadline, "the agent's end never kept its images"
        time.sleep(0.3)
    store = f"/var/lib/leviath/image-store/{bed.users['alice'].uid}"
    found = bed.run(["grep", "-rl", SECRET, store], check=False)
    assert found.returncode == 1 and not found.stdout, (found.stdout, found.stderr)
