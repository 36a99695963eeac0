"""Install the checkout into a booted test bed, as a package would install it.

The dependency venv (/opt/leviath-dev/venv) is visible inside through the
overlay's lowerdir=/; the checkout may live under /root, which test users
cannot enter, so the `leviathd` package is copied to a world-readable folder
and put on the venv's path with a .pth file. Every write lands in the
overlay's tmpfs: the host venv is never touched.

units/ and polkit/ are installed by suffix, whatever files exist:
  units/*.service, *.slice, *.socket, *.timer, *.target, *.path -> /etc/systemd/system/
  units/*.conf holding <busconfig>            -> /usr/share/dbus-1/system.d/
  units/NAME.dbus-service                     -> /usr/share/dbus-1/system-services/NAME.service
  units/NAME.sysusers.conf, sysusers.d/*.conf -> /usr/lib/sysusers.d/NAME.conf (then applied)
  units/NAME.tmpfiles.conf, tmpfiles.d/*.conf -> /usr/lib/tmpfiles.d/NAME.conf (then applied)
  polkit/*.policy                             -> /usr/share/polkit-1/actions/
  polkit/*.rules                              -> /usr/share/polkit-1/rules.d/
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .boot import Testbed

VENV = "/opt/leviath-dev/venv"
PACKAGE_DIR = "/usr/lib/leviathd-test"
EXAMPLES_DIR = "/usr/share/doc/leviathd/examples"
UNIT_SUFFIXES = (".service", ".slice", ".socket", ".timer", ".target", ".path", ".mount")
# Console entry points (pyproject's [project.scripts]), as /usr/bin wrappers.
ENTRY_POINTS = {"lev": "leviathd.cli.main", "leviathd": "leviathd.daemon"}


def _wrapper(module: str) -> str:
    if module == "leviathd.cli.main":
        # As packaging/slim-entry-point.sh writes it for the packages.
        return (
            f"#!{VENV}/bin/python -IS\n"
            "import sys\n"
            f"sys.path.append({PACKAGE_DIR!r})\n"
            f"from {module} import main\n"
            "sys.exit(main())\n"
        )
    return (
        f"#!{VENV}/bin/python\n"
        "import sys\n"
        f"from {module} import main\n"
        "sys.exit(main())\n"
    )


def destinations(checkout: Path) -> list[tuple[Path, str]]:
    """(source file, destination inside the bed) for units/ and polkit/."""
    out: list[tuple[Path, str]] = []
    units = checkout / "units"
    for f in sorted(units.rglob("*")) if units.is_dir() else []:
        if not f.is_file():
            continue
        name = f.name
        if name.endswith(".sysusers.conf") or f.parent.name == "sysusers.d":
            out.append((f, "/usr/lib/sysusers.d/" + name.replace(".sysusers.conf", ".conf")))
        elif name.endswith(".tmpfiles.conf") or f.parent.name == "tmpfiles.d":
            out.append((f, "/usr/lib/tmpfiles.d/" + name.replace(".tmpfiles.conf", ".conf")))
        elif name.endswith(".dbus-service"):
            stem = name.removesuffix(".dbus-service")
            out.append((f, f"/usr/share/dbus-1/system-services/{stem}.service"))
        elif name.endswith(".conf") and "<busconfig" in f.read_text(errors="replace"):
            out.append((f, "/usr/share/dbus-1/system.d/" + name))
        elif name.endswith(UNIT_SUFFIXES) and "[D-BUS Service]" not in f.read_text():
            out.append((f, "/etc/systemd/system/" + name))
        elif name.endswith(".service"):
            out.append((f, "/usr/share/dbus-1/system-services/" + name))
    polkit = checkout / "polkit"
    for f in sorted(polkit.iterdir()) if polkit.is_dir() else []:
        if f.suffix == ".policy":
            out.append((f, "/usr/share/polkit-1/actions/" + f.name))
        elif f.suffix == ".rules":
            out.append((f, "/usr/share/polkit-1/rules.d/" + f.name))
    return out


def install_project(bed: Testbed, checkout: Path, *, systemd: bool = True) -> None:
    """systemd=False: a bed without systemd (no daemon-reload, no units to
    enable; polkitd, if wanted, is started by the caller)."""
    package = checkout / "leviathd"
    if not package.is_dir():
        raise FileNotFoundError(f"{package} is not a folder: is {checkout} the checkout?")
    bed.run(["rm", "-rf", f"{PACKAGE_DIR}/leviathd"])
    bed.copy_in(package, f"{PACKAGE_DIR}/leviathd")
    # Byte-compile as a package install does: users cannot write __pycache__
    # here, and compiling every module on every `lev` call would dominate its
    # start-up time.
    bed.run([f"{VENV}/bin/python", "-m", "compileall", "-q", f"{PACKAGE_DIR}/leviathd"])
    bed.run(["chmod", "-R", "a+rX,go-w", PACKAGE_DIR])
    purelib = bed.run(
        [f"{VENV}/bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    ).stdout.strip()
    # Sorts first, so the copy wins over any other leviathd on the path.
    bed.write_file(f"{purelib}/00-leviathd-test.pth", PACKAGE_DIR + "\n")
    for name, module in ENTRY_POINTS.items():
        bed.write_file(f"/usr/bin/{name}", _wrapper(module), mode=0o755)
    # Where the packages put examples/ (dh_installexamples, %doc): the docs
    # name this path.
    if (checkout / "examples").is_dir():
        bed.run(["rm", "-rf", EXAMPLES_DIR])
        bed.copy_in(checkout / "examples", EXAMPLES_DIR)
        bed.run(["chmod", "-R", "a+rX,go-w", EXAMPLES_DIR])

    installed = destinations(checkout)
    for src, dest in installed:
        bed.copy_in(src, dest, mode=0o644)
    dests = [d for _s, d in installed]
    if any(d.startswith("/usr/lib/sysusers.d/") for d in dests):
        bed.run(["systemd-sysusers"])
    tmpfiles = [d for d in dests if d.startswith("/usr/lib/tmpfiles.d/")]
    if tmpfiles:
        bed.run(["systemd-tmpfiles", "--create", *tmpfiles])
    if any(d.startswith("/usr/share/dbus-1/") for d in dests):
        bed.run(["busctl", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus",
                 "org.freedesktop.DBus", "ReloadConfig"])  # fmt: skip
    if not systemd:
        return
    # The tests restart leviathd far more often than anyone would (dozens of
    # times a minute); the unit's start limit, there to stop a crash loop,
    # would then refuse every later test. The bed lifts it; nothing else.
    bed.write_file("/etc/systemd/system/leviathd.service.d/50-testbed.conf",
                   "[Unit]\nStartLimitIntervalSec=0\n")
    bed.run(["systemctl", "daemon-reload"])
    if any(d.startswith("/usr/share/polkit-1/") for d in dests):
        # polkitd watches its folders, but a restart makes the new actions and
        # rules certain before the first test asks.
        bed.run(["systemctl", "try-restart", "polkit.service"])
    if "/etc/systemd/system/leviathd.service" in dests:
        # As the package's postinst does: enabled (so its D-Bus alias exists), not started.
        bed.run(["systemctl", "enable", "leviathd.service"], check=False)
