"""The CLIs' logins are covered, or the start refused, whatever the host's
permissions (red team of issue 45): the daemon lists the login's folder as
the user, and a folder it cannot list was shown to the agent as it is."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from leviathd.domain.sandbox import SandboxKind
from leviathd.errors import InvalidArgument
from leviathd.proxy import loginfiles, logins
from leviathd.sandbox.spec import Mount, SandboxSpec

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root and a second user")

UID = 4242
ACCESS = "sk-ant-oat01-" + "r" * 60


@pytest.fixture
def home() -> Iterator[Path]:
    """/homes (mode 0711, as multi-user hosts keep /home) / u (the user's,
    0700) / .claude / .credentials.json."""
    base = Path(tempfile.mkdtemp(prefix="leviath-cover-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    top = base / "homes"
    h = top / "u"
    (h / ".claude").mkdir(parents=True)
    (h / ".claude" / "projects").mkdir()
    (h / ".claude" / ".credentials.json").write_text(json.dumps(
        {"claudeAiOauth": {"accessToken": ACCESS, "refreshToken": ACCESS + "x"}}))
    for p in (h, h / ".claude", h / ".claude" / "projects", h / ".claude" / ".credentials.json"):
        os.chown(p, UID, UID)
    os.chmod(h, 0o700)
    os.chmod(top, 0o711)
    yield h
    shutil.rmtree(base)


def _spec(h: Path) -> SandboxSpec:
    claude = str(h / ".claude")
    return SandboxSpec(
        kind=SandboxKind.NAMESPACE, argv=("claude",), env={}, workdir="/w", workdir_mode="rw",
        uid=UID, gid=UID, groups=(), user="u", home=str(h), sandbox_home=str(h),
        mounts=(Mount("bind", claude, claude),), hidden=(), namespaces=(), network=False,
        scratch="/s", hostname="h", execution_id="0123abcd", proxy=True)


def test_a_home_under_a_folder_of_mode_0711_is_covered(home: Path) -> None:
    """The listing used to open every folder above with read rights: under
    a /home of 0711 it failed, and the real folder was bound as it is."""
    plan = logins.Plan()
    spec = logins.plan(_spec(home), plan)
    assert list(plan.files) == ["Claude Code"]
    on_top = [m for m in spec.mounts if m.target == f"{home}/.claude/.credentials.json"]
    assert on_top and on_top[-1].source.endswith("login-claude-code.json"), spec.mounts


def test_a_login_folder_the_daemon_cannot_list_refuses_the_start(home: Path) -> None:
    """An agent that once had the folder as it was (its user logged out)
    made it 0311: later agents would get the real folder. Refused."""
    os.chmod(home / ".claude", 0o311)
    with pytest.raises(InvalidArgument, match="cannot be listed"):
        logins.plan(_spec(home), logins.Plan())


def test_the_daemons_refresh_is_never_written_through_a_login_with_several_names(
        home: Path) -> None:
    """Written in place, the new tokens would reach a hard link an agent
    planted (in its workdir) while the folder was its own."""
    login = home / ".claude" / ".credentials.json"
    planted = home / "planted.json"
    os.link(login, planted)
    with pytest.raises(ValueError, match="several names"):
        loginfiles.write_values(UID, UID, str(home), (".claude", ".credentials.json"),
                                {("claudeAiOauth", "accessToken"): "sk-ant-oat01-NEW"})
    assert "NEW" not in planted.read_text()
