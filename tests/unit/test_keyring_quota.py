"""A user at the kernel's key quota (about 200 running agents of one user
with the default kernel.keys.maxkeys, bench/scale.py) is told which knob it
is, not "Disk quota exceeded"."""

from __future__ import annotations

import errno

import pytest

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
