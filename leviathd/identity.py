"""Who a process or a bus caller is, from the kernel's and the password
database's point of view. Never from anything a client says."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

from leviathd.errors import NotFound


@dataclass(frozen=True)
class UserInfo:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str = "/bin/sh"



def user_info(uid: int) -> UserInfo:
    """The account behind `uid`, with its supplementary groups as the system
    would give them at login (initgroups), not as any caller claims."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        raise NotFound(f"uid {uid} has no account on this machine") from None
    groups = tuple(sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid))))
    return UserInfo(
        name=pw.pw_name,
        uid=pw.pw_uid,
        gid=pw.pw_gid,
        groups=groups,
        home=pw.pw_dir,
        shell=pw.pw_shell or "/bin/sh",
    )
