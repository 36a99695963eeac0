"""%pyproject_install for macros.no-fedora: install the wheel into the RPM's
buildroot at the spec's paths, with python3-installer (no pip, no network).
Debian's sysconfig would send --prefix /usr to /usr/local, hence the scheme."""

import glob
import sys

from installer import install
from installer.destinations import SchemeDictionaryDestination
from installer.sources import WheelFile

buildroot, wheeldir, sitelib, bindir = sys.argv[1:5]
scheme = {"purelib": sitelib, "platlib": sitelib, "scripts": bindir,
          "data": "/usr", "headers": "/usr/include"}
dest = SchemeDictionaryDestination(scheme, interpreter="/usr/bin/python3",
                                   script_kind="posix", destdir=buildroot)
(wheel,) = glob.glob(f"{wheeldir}/*.whl")
with WheelFile.open(wheel) as source:
    install(source, dest, {})
