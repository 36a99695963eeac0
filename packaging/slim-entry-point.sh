#!/bin/sh
# slim-entry-point.sh FILE MODULE: rewrite the console-script wrapper that pip,
# installer or setuptools wrote at FILE (its first line, the interpreter, is
# kept) as three lines that import only MODULE. Their template imports `re`,
# which with enum, functools and the rest is about as much start-up time as
# everything a short `lev` command imports itself (issue 18; bench/table.py).
set -eu
file=$1
module=$2
shebang=$(head -n 1 "$file")
case $shebang in
    '#!'*python*) ;;
    *) echo "slim-entry-point: $file does not start with a Python interpreter line" >&2; exit 1 ;;
esac
grep -q "^from $module import main\$" "$file" || {
    echo "slim-entry-point: $file is not the wrapper of $module:main" >&2
    exit 1
}
printf '%s\nimport sys\nfrom %s import main\nsys.exit(main())\n' "$shebang" "$module" > "$file.slim"
chmod 0755 "$file.slim"
mv "$file.slim" "$file"
