"""The container kind's image is pinned (issue 29, item 5;
leviathd/sandbox/container/pins.py): the machine's `[sandbox] image` is
resolved to an image ID when the configuration loads, and bob's
container-kind agents run that ID, whatever anyone retags afterwards, from
inside an agent (alice's, through her engine socket) or in root's storage,
until root reloads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

pytestmark = pytest.mark.testbed

PIN = "localhost/leviath-pin:1"
EVIL = "localhost/leviath-pin-evil:1"
CONFIG = f"""[sandbox]
kind = "namespace"
image = "{PIN}"
on_unavailable = "error"
[sandbox.containers]
enabled = true
[resources]
memory_max = "256M"
tasks_max = 200
"""
BOB_CONFIG = """[sandbox]
kind = "container"
[sandbox.containers]
enabled = false
"""

TARBALL = r"""set -e
command -v podman >/dev/null || { echo "no podman in the bed" >&2; exit 3; }
[ -x /bin/busybox ] || { echo "no static busybox (busybox-static) in the bed" >&2; exit 3; }
d=$(mktemp -d /var/tmp/leviath-image.XXXXXX); chmod 755 "$d"
mkdir -p "$d/bin" "$d/etc" "$d/tmp" "$d/proc" "$d/sys" "$d/dev" "$d/root"; chmod 1777 "$d/tmp"
cp /bin/busybox "$d/bin/busybox"
for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$d/bin/$a"; done
echo 'root:x:0:0:root:/root:/bin/sh' > "$d/etc/passwd"; echo 'root:x:0:' > "$d/etc/group"
echo "$2" > "$d/marker"
tar -C "$d" -cf "$1" .
rm -rf "$d"
"""

# Inside alice's agent: the trojan imported and tagged as the machine's image.
RETAG = r'''
import http.client, json, os, socket
class Conn(http.client.HTTPConnection):
    def __init__(self):
        super().__init__("localhost", timeout=120)
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(os.environ["DOCKER_HOST"].removeprefix("unix://"))
def ask(method, path, body=None, ctype="application/json"):
    c = Conn(); c.request(method, path, body=body, headers={"Content-Type": ctype})
    r = c.getresponse(); raw = r.read(); return r.status, raw.decode(errors="replace")
status, made = ask("POST", "/images/create?fromSrc=-&repo=localhost/leviath-pin&tag=1",
                   open("evil.tar", "rb").read(), "application/x-tar")
print(json.dumps([status, made]))
image = json.loads(made.strip().splitlines()[-1])["id"].removeprefix("sha256:")
# (tagging is refused by the filter; a build's tag is not)
import io, tarfile
ctx = io.BytesIO()
with tarfile.open(fileobj=ctx, mode="w") as t:
    data = f"FROM {image}\n".encode()
    info = tarfile.TarInfo("Dockerfile"); info.size = len(data)
    t.addfile(info, io.BytesIO(data))
print(json.dumps(ask("POST", "/build?t=localhost/leviath-pin:1&networkmode=none", ctx.getvalue(),
                     "application/x-tar")))
'''


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    for tar, marker in (("/var/tmp/leviath-pin-good.tar", "good"),
                        ("/var/tmp/leviath-pin-evil.tar", "evil")):
        r = testbed.run(["sh", "-c", TARBALL, "sh", tar, marker], check=False, timeout=180)
        if r.returncode == 3:
            pytest.skip(r.stderr.strip())
        assert r.returncode == 0, r.stderr
    testbed.run(["podman", "import", "/var/tmp/leviath-pin-good.tar", PIN])
    testbed.run(["podman", "import", "/var/tmp/leviath-pin-evil.tar", EVIL])
    alice, bob = testbed.users["alice"], testbed.users["bob"]
    testbed.run(["mkdir", "-p", "pin-work"], user="alice")
    testbed.run(["mkdir", "-p", "pin-work", ".config/leviath"], user="bob")
    testbed.run(["cp", "/var/tmp/leviath-pin-evil.tar", f"{alice.home}/pin-work/evil.tar"])
    testbed.write_file(f"{alice.home}/pin-work/retag.py", RETAG)
    testbed.run(["chown", "-R", "alice:", f"{alice.home}/pin-work"])
    testbed.write_file(f"{bob.home}/.config/leviath/config.toml", BOB_CONFIG)
    testbed.run(["chown", "bob:", f"{bob.home}/.config/leviath/config.toml"])
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    testbed.run(["systemctl", "restart", "leviathd"])
    yield testbed
    testbed.run(["rm", "-f", f"{bob.home}/.config/leviath/config.toml"])
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.run(["podman", "rmi", "-f", PIN, EVIL], check=False)


def _bobs_marker(bed: Testbed) -> str:
    home = bed.users["bob"].home
    r = bed.run(["lev", "run", "--", "cat", "/marker"], user="bob", cwd=f"{home}/pin-work",
                check=False, timeout=180)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r.stdout.strip()


def test_alices_agent_retagging_the_machine_image_does_not_change_what_bob_runs(
        bed: Testbed) -> None:
    assert _bobs_marker(bed) == "good"
    home = bed.users["alice"].home
    r = bed.run(["lev", "run", "--", "python3", "retag.py"], user="alice",
                cwd=f"{home}/pin-work", check=False, timeout=180)
    assert r.returncode == 0, (r.stdout, r.stderr)
    replies = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("[")]
    assert [x[0] for x in replies] == [200, 200], r.stdout  # the agent's own to do
    try:
        assert _bobs_marker(bed) == "good"
    finally:
        bed.run(["podman", "tag", _root_id(bed, "good"), PIN], check=False)


def _root_id(bed: Testbed, marker: str) -> str:
    """The ID of root's image whose /marker says `marker`."""
    out = bed.run(["podman", "images", "--no-trunc", "--format", "{{.ID}}"]).stdout.split()
    for image in dict.fromkeys(out):
        r = bed.run(["podman", "run", "--rm", "--runtime", "runc", "--network", "none",
                     "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000", image,
                     "cat", "/marker"], check=False)
        if r.returncode == 0 and r.stdout.strip() == marker:
            return image.removeprefix("sha256:")
    raise AssertionError(f"no image of root's says {marker}")


def test_a_retag_in_roots_storage_changes_nothing_until_a_reload(bed: Testbed) -> None:
    good = _root_id(bed, "good")
    bed.run(["podman", "tag", good, PIN])
    bed.run(["systemctl", "reload", "leviathd"])
    assert _bobs_marker(bed) == "good"
    bed.run(["podman", "tag", EVIL, PIN])
    try:
        assert _bobs_marker(bed) == "good"  # pinned at load: the new tag is not what runs
        # A reload is root's word that the tag is meant: it is resolved again.
        bed.run(["systemctl", "reload", "leviathd"])
        assert _bobs_marker(bed) == "evil"
    finally:
        bed.run(["podman", "tag", good, PIN])
        bed.run(["systemctl", "reload", "leviathd"])


def test_a_container_kind_agent_gets_its_users_own_engine_too(bed: Testbed) -> None:
    bob = bed.users["bob"]
    path = f"{bob.home}/.config/leviath/config.toml"
    bed.write_file(path, '[sandbox]\nkind = "container"\n')
    bed.run(["chown", "bob:", path])
    try:
        r = bed.run(["lev", "run", "--detach", "--", "sh", "-c",
                     'echo "$DOCKER_HOST"; test -S /run/leviath/engine.sock && sleep 120'],
                    user="bob", cwd=f"{bob.home}/pin-work", check=False, timeout=180)
        assert r.returncode == 0, (r.stdout, r.stderr)
        agent_id = r.stdout.strip()
        try:
            # Its engine: bob's rootless podman, in bob's agent's scope (it
            # starts once the agent's container runs: waited for).
            deadline = time.monotonic() + 60
            while True:
                found = bed.run(["sh", "-c", "for p in $(pgrep -f 'podman .*system service'); "
                                 "do echo $(stat -c %u /proc/$p) $(grep name=systemd "
                                 "/proc/$p/cgroup || grep ^0:: /proc/$p/cgroup); done"]).stdout
                mine = [ln for ln in found.splitlines() if agent_id in ln]
                if mine or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            assert mine and all(ln.split()[0] == str(bob.uid) for ln in mine), found
        finally:
            bed.run(["lev", "stop", agent_id], user="bob", check=False)
    finally:
        bed.write_file(path, BOB_CONFIG)
        bed.run(["chown", "bob:", path])
