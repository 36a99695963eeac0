"""The file worker opens in the agent's view (broker/opener.py, issue 43 item
3): given a pidfd on a process of another mount namespace (here one made by
`unshare -m` that binds a file read-only onto itself and hides a folder
under a tmpfs, as an agent's fence does), the worker enters that namespace
once and every open goes through its mounts. The host's view, for the same
user, would write the file and read the hidden one. The bed test
(tests/integration/test_broker_view.py) does it through a real agent."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from leviathd.broker.opener import Opener, OpenFailed

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="entering a mount namespace")

NOBODY = 65534
FENCE = """
set -e
mount --make-rprivate /
mount --bind "$1/file" "$1/file"
mount -o remount,bind,ro "$1/file"
mount -t tmpfs none "$1/hidden"
echo ready
exec sleep 120
"""


@pytest.fixture
def place() -> Iterator[str]:
    top = tempfile.mkdtemp(prefix="leviath-view-")
    os.chmod(top, 0o755)
    os.mkdir(f"{top}/hidden")
    os.chmod(f"{top}/hidden", 0o755)
    for path in (f"{top}/file", f"{top}/hidden/secret"):
        with open(path, "w") as f:
            f.write("host\n")
        os.chown(path, NOBODY, NOBODY)
    try:
        yield top
    finally:
        shutil.rmtree(top)


def test_the_worker_opens_in_the_fences_mounts_not_the_hosts(place: str) -> None:
    fence = subprocess.Popen(["unshare", "-m", "sh", "-c", FENCE, "fence", place],
                             stdout=subprocess.PIPE, text=True)
    assert fence.stdout is not None
    try:
        assert fence.stdout.readline().strip() == "ready"
        host = Opener(uid=NOBODY, gid=NOBODY, groups=[])
        view = Opener(uid=NOBODY, gid=NOBODY, groups=[], fence=os.pidfd_open(fence.pid))
        try:
            # The host's view, for the same user: writable, and not hidden.
            os.close(host.open(f"{place}/file", os.O_WRONLY))
            os.close(host.open(f"{place}/hidden/secret", os.O_RDONLY))
            # The fence's view: the bind is read-only, the folder empty.
            with pytest.raises(OpenFailed) as ro:
                view.open(f"{place}/file", os.O_WRONLY)
            assert ro.value.errno == errno.EROFS
            with pytest.raises(OpenFailed) as hidden:
                view.open(f"{place}/hidden/secret", os.O_RDONLY)
            assert hidden.value.errno == errno.ENOENT
            fd = view.open(f"{place}/file", os.O_RDONLY)
            os.close(fd)
            # Entered once, as the user, for good.
            assert (os.stat(f"/proc/{view.pid}/ns/mnt").st_ino
                    == os.stat(f"/proc/{fence.pid}/ns/mnt").st_ino)
            with open(f"/proc/{view.pid}/status") as f:
                ids = {line.split(":")[0]: line.split()[1:] for line in f}
            assert ids["Uid"] == [str(NOBODY)] * 4 and ids["Gid"] == [str(NOBODY)] * 4
            assert ids["CapEff"] == ["0000000000000000"]
            assert not view.stale()
            fence.kill()
            fence.wait()
            # Its fence ended (a new step, the agent ending): the broker replaces it.
            assert view.stale()
        finally:
            host.close()
            view.close()
    finally:
        fence.kill()
        fence.wait()
