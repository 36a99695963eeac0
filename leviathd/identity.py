"""Who a process or a bus caller is, from the kernel's and the password
database's point of view. Never from anything a client says."""

from __future__ import annotations

import grp
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

    def group_names(self) -> tuple[str, ...]:
        names = []
        for gid in self.groups:
            try:
                names.append(grp.getgrgid(gid).gr_name)
            except KeyError:
                names.append(str(gid))
        return tuple(names)


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


def user_by_name(name: str) -> UserInfo:
    try:
        return user_info(pwd.getpwnam(name).pw_uid)
    except KeyError:
        raise NotFound(f"no user named {name!r}") from None
