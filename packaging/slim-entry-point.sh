#!/bin/sh
# slim-entry-point.sh FILE MODULE SITEDIR: rewrite the console-script wrapper
# that pip, installer or setuptools wrote at FILE as four lines that import
# only MODULE, from SITEDIR (where the package installed it), under
# `python3 -IS`. Their template imports `re`, which with enum, functools and
# the rest is about as much start-up time as everything a short `lev` command
# imports itself, and `site` reads every .pth file of the site folders: ~3 ms
# more (issue 18; bench/table.py). -I also keeps the caller's PYTHON*
# variables, user site folder and working folder out of lev's imports.
# leviathd.cli.lazysite runs `site` for the commands that need a library
# from those folders.
set -eu
file=$1
module=$2
sitedir=$3
shebang=$(head -n 1 "$file")
case $shebang in
    '#!'*python*) ;;
    *) echo "slim-entry-point: $file does not start with a Python interpreter line" >&2; exit 1 ;;
esac
grep -q "^from $module import main\$" "$file" || {
    echo "slim-entry-point: $file is not the wrapper of $module:main" >&2
    exit 1
}
# The package root: FILE is ROOT/usr/bin/NAME (or ROOT/bin/NAME).
root=${file%/*}
root=${root%/bin}
root=${root%/usr}
top=${module%%.*}
# Debian: run after dh_python3, which moves the package to SITEDIR (and would
# rewrite this #! line again if it ran later).
[ -d "$root$sitedir/$top" ] || {
    echo "slim-entry-point: $top is not installed in $root$sitedir" >&2
    exit 1
}
# The interpreter alone: build tools add their own flags (-s, -sP), which
# -IS covers.
interpreter=$(printf '%s\n' "${shebang#\#!}" | awk '{print $1}')
printf '#!%s -IS\nimport sys\nsys.path.append(%s)\nfrom %s import main\nsys.exit(main())\n' \
    "$interpreter" "'$sitedir'" "$module" > "$file.slim"
chmod 0755 "$file.slim"
mv "$file.slim" "$file"
