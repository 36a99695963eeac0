"""A user at the kernel's key quota (about 200 running agents of one user
with the default kernel.keys.maxkeys, bench/scale.py) is told which knob it
is, not "Disk quota exceeded"."""

from __future__ import annotations

import errno
import os

import pytest

from leviathd.agents import admission
from leviathd.sandbox import privileges


class _FullQuota:
    def syscall(self, *args: object) -> int:
        return -1


def test_a_full_key_quota_names_its_sysctl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(privileges, "_libc", _FullQuota())
    monkeypatch.setattr(privileges.ctypes, "get_errno", lambda: errno.EDQUOT)
    with pytest.raises(OSError) as got:
        privileges.join_new_session_keyring()
    assert got.value.errno == errno.EDQUOT
    assert "kernel.keys.maxkeys" in str(got.value)


# The kernel's own lines (security/keys/proc.c: "%5d: %5d %d/%d %d/%d %d/%d").
KEY_USERS = """\
    0:    10 9/9 4/1000000 65/25000000
 1000:   200 200/200 200/200 2090/20000
 1001:     3 3/3 2/200 50/20000
"""


def test_key_users_lines_are_read_for_the_uid_asked() -> None:
    assert admission.parse_key_users(KEY_USERS, 1000) == admission.KeyUse(200, 200, 2090, 20000)
    assert admission.parse_key_users(KEY_USERS, 1001) == admission.KeyUse(2, 200, 50, 20000)
    assert admission.parse_key_users(KEY_USERS, 100) is None  # not " 1000" by its tail
    assert admission.parse_key_users("1000: 3 garbage", 1000) is None


def test_a_user_at_the_key_quota_is_refused_before_the_start_naming_the_sysctl() -> None:
    full = admission.KeyUse(199, 200, 1000, 20000)
    admission.check_keys("alice", full, starting=1)  # one keyring left: this start's
    with pytest.raises(admission.Refused) as got:
        admission.check_keys("alice", full, starting=2)  # another start under way took it
    assert "kernel.keys.maxkeys" in str(got.value) and "199 of 200" in str(got.value)
    with pytest.raises(admission.Refused, match=r"kernel\.keys\.maxbytes"):
        admission.check_keys("alice", admission.KeyUse(3, 200, 19990, 20000), starting=1)
    admission.check_keys("alice", None, starting=5)  # a kernel without keys: nothing to hold


def test_the_machine_cap_counts_running_agents_and_starts_under_way() -> None:
    admission.check_cap("bob", running=2, starting=1, cap=3)
    admission.check_cap("bob", running=2, starting=9, cap=None)
    with pytest.raises(admission.Refused, match=r"\[limits\] agents_per_user"):
        admission.check_cap("bob", running=2, starting=2, cap=3)


def test_the_kernel_figures_of_this_host_read() -> None:
    use = admission.key_use(os.getuid())
    assert use is not None and use.maxkeys > 0 and use.keys >= 0
