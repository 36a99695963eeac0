#!/bin/sh
# Runs inside the Debian 13 build root (tests/vm/image.py build_debs), with the
# checkout's files in $B/leviathd: builds the .deb as docs/packaging.md
# says, runs lintian on it, then builds the same source again as version
# VERSION$1 (a changelog entry added here only) for the upgrade check.
set -e
B=$2
fail() { tail -n 60 "$1" >&2; exit 1; }
cd $B/leviathd
rm -rf debian
cp -a packaging/debian debian
dpkg-buildpackage -us -uc -b >$B/build.log 2>&1 || fail $B/build.log
lintian --no-tag-display-limit --info ../leviathd_*.deb >$B/lintian.log 2>&1 || true
mkdir -p $B/out/upgrade
mv ../leviathd_*.deb $B/out/
{
    printf 'leviathd (%s%s) unstable; urgency=medium\n\n' "$(dpkg-parsechangelog -S Version)" "$1"
    printf '  * Upgrade test build.\n\n'
    printf ' -- %s  %s\n\n' "$(dpkg-parsechangelog -S Maintainer)" "$(dpkg-parsechangelog -S Date)"
    cat debian/changelog
} >debian/changelog.new
mv debian/changelog.new debian/changelog
dpkg-buildpackage -us -uc -b >$B/build-upgrade.log 2>&1 || fail $B/build-upgrade.log
mv ../leviathd_*.deb $B/out/upgrade/
