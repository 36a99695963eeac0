"""Build the RPM from the checkout with rpmbuild (packaging/rpm/leviathd.spec)
where Fedora's macros are missing (Debian's rpm: packaging/rpm/macros.no-fedora
stands in), run rpmlint, and list its files, for tests/vm/test_debian13.py."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import image

SPEC = image.CHECKOUT / "packaging" / "rpm" / "leviathd.spec"
MACROS = image.CHECKOUT / "packaging" / "rpm" / "macros.no-fedora"


def _version() -> str:
    for line in SPEC.read_text().splitlines():
        if line.startswith("Version:"):
            return line.split()[1]
    raise RuntimeError("no Version: in the spec")


def build(top: Path) -> Path:
    """The noarch .rpm, built under top (rpmbuild's _topdir)."""
    version = _version()
    sources = top / "SOURCES"
    sources.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sources / f"leviathd-{version}.tar.gz", "w:gz") as tar:
        for f in image._source_files():
            tar.add(image.CHECKOUT / f, arcname=f"leviathd-{version}/{f}")
    (sources / "leviath.sysusers.conf").write_bytes(
        (image.CHECKOUT / "units" / "leviath.sysusers.conf").read_bytes())
    fedora = subprocess.run(["rpm", "--eval", "%{?pyproject_wheel}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    load = [] if fedora else ["--load", str(MACROS)]
    r = subprocess.run(
        ["rpmbuild", "-bb", "--nodeps", *load, "--define", f"_topdir {top}", str(SPEC)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )
    if r.returncode != 0:
        raise RuntimeError(f"rpmbuild failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    rpms = sorted((top / "RPMS").rglob("leviathd-*.rpm"))
    if len(rpms) != 1:
        raise RuntimeError(f"expected one leviathd RPM, found {rpms}")
    return rpms[0]


def rpmlint(rpm: Path) -> tuple[int, str]:
    rc = SPEC.with_name("leviathd.rpmlintrc")
    r = subprocess.run(["rpmlint", "-r", str(rc), str(SPEC), str(rpm)],
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def regular_files(rpm: Path) -> set[str]:
    """Regular files the RPM carries; %ghost ones (the metrics file rpm -e
    removes) are named, not shipped, so they do not count."""
    r = subprocess.run(["rpm", "-qp", "--qf", "[%{FILEMODES:perms} %{FILEFLAGS:fflags}. "
                        "%{FILENAMES}\n]", str(rpm)], capture_output=True, text=True, check=True)
    rows = (ln.split(" ", 2) for ln in r.stdout.splitlines() if ln.startswith("-"))
    return {path for _, flags, path in rows if "g" not in flags}


def deb_regular_files(deb: Path) -> set[str]:
    r = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True)
    return {ln.split()[-1].removeprefix(".") for ln in r.stdout.splitlines() if ln[:1] == "-"}


def deb_file(deb: Path, path: str) -> bytes:
    """The contents of `path` (/usr/bin/lev) in the .deb."""
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True,
                         check=True).stdout
    return subprocess.run(["tar", "-xOf", "-", f".{path}"], input=tar, capture_output=True,
                          check=True).stdout


def rpm_file(rpm: Path, path: str) -> bytes:
    """The contents of `path` (/usr/bin/lev) in the RPM."""
    archive = subprocess.run(["rpm2cpio", str(rpm)], capture_output=True, check=True).stdout
    return subprocess.run(["cpio", "-i", "--quiet", "--to-stdout", f".{path}"], input=archive,
                          capture_output=True, check=True).stdout


def comparable(paths: set[str]) -> set[str]:
    """Paths with what differs by distribution convention alone made equal:
    site-packages, the doc folder's name, compressed man pages, metadata the
    tools write; and without what only one of them has by design (Debian's
    changelog, copyright and lintian overrides, the RPM's licence folder and
    preset)."""
    out = set()
    for p in paths:
        if ".dist-info/" in p or p.startswith(("/usr/share/lintian/", "/usr/share/licenses/",
                                                "/usr/lib/systemd/system-preset/")):
            continue
        for site in ("/usr/lib/python3/dist-packages/", "/usr/lib/python3/site-packages/"):
            p = p.replace(site, "PYTHON/")
        p = p.replace("/usr/share/doc/leviathd-" + _version() + "/", "/usr/share/doc/leviathd/")
        p = p.replace("/usr/share/doc/leviathd/examples/config.toml",
                      "/usr/share/doc/leviathd/config.example.toml")
        p = p.removesuffix(".gz")
        if p in ("/usr/share/doc/leviathd/changelog", "/usr/share/doc/leviathd/copyright"):
            continue
        if p.endswith((".pyc", "/py.typed")):  # the typing marker: wheel tools differ
            continue
        out.add(p)
    return out
