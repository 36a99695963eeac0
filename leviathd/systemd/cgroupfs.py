"""Where a control group lives in the mounted cgroup hierarchies (v1, v2 or
both, as this host mounts them)."""

from __future__ import annotations

import posixpath


def _within(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def folders(cgroup: str, mountinfo: str | None = None) -> list[str]:
    """The folder of `cgroup` in every mounted hierarchy whose mount root
    holds it (existing or not). Pure when given the mount table."""
    if mountinfo is None:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mountinfo = f.read()
    out: list[str] = []
    for line in mountinfo.splitlines():
        fields, sep, after = line.partition(" - ")
        if not sep or after.split(" ", 1)[0] not in ("cgroup", "cgroup2"):
            continue
        parts = fields.split(" ")
        root, mountpoint = parts[3], parts[4]
        if not _within(cgroup, root):
            continue
        rel = cgroup[len(root):] if root != "/" else cgroup
        path = posixpath.join(mountpoint, rel.lstrip("/"))
        if path not in out:
            out.append(path)
    return out
