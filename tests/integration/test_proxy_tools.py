"""Common agent work through network = "proxy" (issue 12, the default's
question): pip, npm, git over https and over ssh, each from a local server
in the test's "outside" network namespace (test_proxy.py's allowed.test),
reached only through the daemon's proxy."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import time
import zipfile
from collections.abc import Iterator

import pytest
from test_gate_bed import Agent
from test_proxy import OUTSIDE, agent, bed  # noqa: F401  (the servers, names and agent)
from testbed import Testbed

pytestmark = pytest.mark.testbed

SSHD_CONFIG = f"""Port 22
ListenAddress {OUTSIDE}
HostKey /srv/ssh/host_key
AuthorizedKeysFile /srv/ssh/authorized_keys
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM yes
PidFile none
"""


def wheel() -> bytes:
    buf = io.BytesIO()
    files = {
        "demo/__init__.py": b"VALUE = 'from the local index'\n",
        "demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
        "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                                    b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in files) + "demo-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("demo-1.0.dist-info/RECORD", record)
    return buf.getvalue()


def npm_tarball() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data in (("package/package.json",
                            b'{"name": "demo", "version": "1.0.0", "main": "index.js"}'),
                           ("package/index.js", b"module.exports = 'from the local registry';\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def tools(bed: Testbed, agent: Agent) -> Iterator[Agent]:  # noqa: F811
    whl = wheel()
    tgz = npm_tarball()
    bed.run("mkdir -p /srv/www/simple/demo /srv/www/npm /srv/ssh /run/sshd")
    bed.run(["sh", "-c", "cat > /srv/www/simple/demo/demo-1.0-py3-none-any.whl"], input=whl)
    sha = hashlib.sha256(whl).hexdigest()
    name = "demo-1.0-py3-none-any.whl"
    bed.write_file("/srv/www/simple/demo/index.html",
                   f'<a href="{name}#sha256={sha}">{name}</a>\n')
    bed.run(["sh", "-c", "cat > /srv/www/npm/demo-1.0.0.tgz"], input=tgz)
    packument = {"name": "demo", "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": {
        "name": "demo", "version": "1.0.0", "main": "index.js",
        "dist": {"tarball": "http://allowed.test/npm/demo-1.0.0.tgz",
                 "shasum": hashlib.sha1(tgz).hexdigest()}}}}
    bed.write_file("/srv/www/npm/demo", json.dumps(packument))
    home = bed.users["alice"].home
    bed.write_file("/srv/ssh/sshd_config", SSHD_CONFIG)
    bed.run(f"""set -e
        rm -f /srv/ssh/host_key* /srv/ssh/id*
        ssh-keygen -q -t ed25519 -N '' -f /srv/ssh/host_key
        ssh-keygen -q -t ed25519 -N '' -f /srv/ssh/id
        cp /srv/ssh/id.pub /srv/ssh/authorized_keys
        install -o alice -m 600 /srv/ssh/id {home}/pw/id
        chmod -R a+rX /srv/www
        rm -rf /srv/alice.git && cp -r /srv/www/repo.git /srv/alice.git
        chown -R alice /srv/alice.git""")
    sshd = subprocess.Popen(bed.command(["ip", "netns", "exec", "lvout", "/usr/sbin/sshd", "-D",
                                         "-e", "-f", "/srv/ssh/sshd_config"]))
    time.sleep(0.5)
    yield agent
    sshd.kill()
    sshd.wait()


def test_pip_installs_from_an_index_through_the_proxy(tools: Agent) -> None:
    rc, out, err = tools.call(
        "rm -rf pipt && python3 -m pip install -q --no-cache-dir --target pipt "
        "--cert ca.pem --index-url https://allowed.test/simple demo && "
        "PYTHONPATH=pipt python3 -c 'import demo; print(demo.VALUE)'", timeout=120)
    assert rc == 0 and out.strip().endswith("from the local index"), out + err


def test_npm_installs_from_a_registry_through_the_proxy(tools: Agent) -> None:
    rc, out, err = tools.call(
        "rm -rf npmt && mkdir npmt && cd npmt && echo '{}' > package.json && "
        "npm install --no-audit --no-fund --cache ../npmcache "
        "--registry http://allowed.test/npm/ demo >/dev/null && "
        "node -e 'console.log(require(\"demo\"))'", timeout=120)
    assert rc == 0 and out.strip().endswith("from the local registry"), out + err


def test_git_clones_over_https_through_the_proxy(tools: Agent) -> None:
    rc, out, err = tools.call("rm -rf hc && GIT_SSL_CAINFO=ca.pem git clone -q "
                              "https://allowed.test/repo.git hc && cat hc/f")
    assert rc == 0 and out == "x\n", err


def test_git_clones_over_ssh_through_the_proxy(tools: Agent) -> None:
    """The daemon's core.sshCommand (ssh through `lev connect`), with the
    key and host checks this test needs added to it."""
    rc, out, err = tools.call(
        "rm -rf sc && ssh=$(git config core.sshCommand) && "
        "GIT_SSH_COMMAND=\"$ssh -i id -o StrictHostKeyChecking=no "
        "-o UserKnownHostsFile=/dev/null -o BatchMode=yes\" "
        "git clone -q alice@allowed.test:/srv/alice.git sc && cat sc/f", timeout=60)
    assert rc == 0 and out == "x\n", err
