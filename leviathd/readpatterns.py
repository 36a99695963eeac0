"""The read-path pattern language: which files outside its workdir an agent may read.

A blueprint *declares* patterns in `[read_paths] allow`; the machine or user
config *grants* them. Only a pattern that is both declared and granted is
active, and a read is decided on the real (symlink-resolved) path. The
language sits below both of its users (config's models parse with it, the
gate and the broker match with it), so it imports neither.

Pattern forms (see docs/configuration.md, "Read paths"):

- exact, absolute or `~/`: `/data/runs`, `~/.leviath/runs` -- the path and its subtree;
- relative: `../shared-docs`, `notes` -- resolved against the run's workdir, subtree too;
- `glob:` -- `*` and `?` stay inside one component, `**` (a whole component) spans any
  number of components, including none;
- `regex:` -- anchored (the whole path must match) and absolute: it must start with `/`,
  `~/` or a drive letter.

`~` always means the agent user's home, never the daemon's. Catch-alls (a pattern that
matches the whole file system or the whole home) are refused when parsed, so a blueprint
that declares `regex:.*` or `glob:/**` does not load.

How the broker must use this module: open the file first (never follow a path twice), then
take the real path of the *opened descriptor* from `/proc/self/fd/N` and decide on that with
`may_read` -- `open_for_read` does exactly this. `real_path` (os.path.realpath) is only for
callers that cannot hold a descriptor, and is racy: a link can change between the check and
the use.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from leviathd.errors import AccessDenied, InvalidArgument

GLOB_PREFIX = "glob:"
REGEX_PREFIX = "regex:"

# Placeholder home and workdir used to check patterns when they are parsed, before the
# user and the run are known.
_PROBE_HOME = "/home/probe-user"
_PROBE_WORKDIR = "/srv/probe/a/b/c/d/e/f/g/h/work"

# A pattern matching every path of one of these groups is a catch-all and is refused.
_ROOT_PROBES = (
    "/etc/shadow",
    "/root/.ssh/id_rsa",
    "/proc/1/environ",
    "/var/lib/leviath/state",
    "/zz-probe/unrelated/file",
)
_HOME_PROBE_TAILS = ("/.ssh/id_ed25519", "/.gnupg/private-keys-v1.d/key", "/zz-probe/file")

_DRIVE = re.compile(r"^[A-Za-z]:[/\\]")
_NEVER = re.compile(r"(?!)")  # matches nothing: a Windows pattern on Linux


class ReadPathError(InvalidArgument, ValueError):
    """A read-path pattern is malformed or too broad. Also a ValueError, so model
    validators report it as a field error with the key that holds it."""


class PatternKind(StrEnum):
    EXACT = "exact"
    GLOB = "glob"
    REGEX = "regex"


@dataclass(frozen=True)
class ReadPattern:
    """A parsed pattern, not yet bound to a home or a workdir.

    `text` is the canonical spelling (trailing `/` removed): two declarations that mean the
    same pattern have the same `text`, which is what declared-vs-granted compares."""

    text: str
    kind: PatternKind
    body: str  # without the `glob:`/`regex:` prefix
    relative: bool  # resolved against the workdir
    windows: bool = False  # starts with a drive letter; never matches on Linux


@dataclass(frozen=True)
class CompiledPattern:
    pattern: ReadPattern
    regex: re.Pattern[str]
    base: str | None = None  # exact patterns: the absolute path whose subtree is granted

    def matches(self, real: str) -> bool:
        if self.base is not None:
            return is_inside(real, self.base)
        return self.regex.fullmatch(real) is not None


@dataclass(frozen=True)
class ReadGrants:
    """What one run may read: its workdir and the active (declared and granted) patterns,
    bound to the user's home and the run's workdir. `rejected` lists patterns that could
    not be bound (for example a relative entry that climbs to `/`), with the reason."""

    workdir: str
    home: str
    patterns: tuple[CompiledPattern, ...] = ()
    hidden: tuple[str, ...] = ()
    rejected: tuple[tuple[str, str], ...] = field(default=())

    def may_read(self, real: str) -> bool:
        return may_read(real, self)

    def may_write(self, real: str) -> bool:
        return may_write(real, self)


# --------------------------------------------------------------------------- parsing


def _components(path: str) -> list[str]:
    return path.split("/")


def _check_no_dots(parts: Sequence[str], text: str, *, what: str) -> None:
    for part in parts:
        if part in (".", ".."):
            raise ReadPathError(
                f"{text!r}: {what} may not contain '.' or '..' components "
                "(only a relative entry may start with them)"
            )


def _strip_trailing_slash(body: str) -> str:
    while len(body) > 1 and body.endswith("/") and not body.endswith(":/"):
        body = body[:-1]
    return body


def _split_relative(body: str) -> tuple[list[str], list[str]]:
    """Split a relative entry into its leading run of `.`/`..` and the rest."""
    parts = _components(body)
    i = 0
    while i < len(parts) and parts[i] in (".", ".."):
        i += 1
    return parts[:i], parts[i:]


def parse_pattern(text: str) -> ReadPattern:
    """Check one pattern's syntax and breadth; raise ReadPathError saying what is wrong."""
    if not isinstance(text, str):
        raise ReadPathError(f"read path must be a string, not {type(text).__name__}")
    if text != text.strip() or not text:
        raise ReadPathError(f"{text!r}: empty, or has leading or trailing spaces")
    if "\0" in text or "\n" in text:
        raise ReadPathError(f"{text!r}: contains a NUL or newline")

    if text.startswith(REGEX_PREFIX):
        pattern = _parse_regex(text[len(REGEX_PREFIX) :], text)
    elif text.startswith(GLOB_PREFIX):
        pattern = _parse_glob(text[len(GLOB_PREFIX) :], text)
    else:
        pattern = _parse_exact(text)
    _refuse_catch_all(pattern)
    return pattern


def _parse_regex(body: str, text: str) -> ReadPattern:
    windows = bool(_DRIVE.match(body))
    if not (body.startswith("/") or body.startswith("~/") or windows):
        raise ReadPathError(
            f"{text!r}: a regex must be absolute: start with '/', '~/' or a drive letter "
            "(use glob: for paths relative to the workdir)"
        )
    try:
        re.compile(body)
    except re.error as exc:
        raise ReadPathError(f"{text!r}: not a valid regular expression: {exc}") from None
    return ReadPattern(
        text=text, kind=PatternKind.REGEX, body=body, relative=False, windows=windows
    )


def _parse_glob(body: str, text: str) -> ReadPattern:
    if not body:
        raise ReadPathError(f"{text!r}: empty glob")
    windows = bool(_DRIVE.match(body))
    body = _strip_trailing_slash(body.replace("\\", "/") if windows else body)
    relative = not (body.startswith("/") or body.startswith("~/") or body == "~" or windows)
    if body.startswith("~") and not (body == "~" or body.startswith("~/")):
        raise ReadPathError(f"{text!r}: only '~/' (the agent user's home) is supported")
    parts = _components(body)
    if relative:
        _lead, parts = _split_relative(body)
    else:
        parts = parts[1:]
    if "" in parts[:-1] or (parts and parts[-1] == "" and len(parts) > 1):
        raise ReadPathError(f"{text!r}: empty path component ('//')")
    _check_no_dots(parts, text, what="a glob")
    for part in parts:
        if "**" in part and part != "**":
            raise ReadPathError(f"{text!r}: '**' must be a whole path component, as in a/**/b")
    return ReadPattern(
        text=GLOB_PREFIX + body,
        kind=PatternKind.GLOB,
        body=body,
        relative=relative,
        windows=windows,
    )


def _parse_exact(text: str) -> ReadPattern:
    windows = bool(_DRIVE.match(text))
    body = _strip_trailing_slash(text.replace("\\", "/") if windows else text)
    if body.startswith("~") and not (body == "~" or body.startswith("~/")):
        raise ReadPathError(f"{text!r}: only '~/' (the agent user's home) is supported")
    if any(c in body for c in "*?"):
        raise ReadPathError(f"{text!r}: wildcards in a plain path; write glob:{body}")
    relative = not (body.startswith("/") or body.startswith("~") or windows)
    if relative:
        _lead, rest = _split_relative(body)
    else:
        rest = _components(body)[1:]
    if "" in rest[:-1] or (rest and rest[-1] == "" and len(rest) > 1):
        raise ReadPathError(f"{text!r}: empty path component ('//')")
    _check_no_dots(rest, text, what="a path")
    return ReadPattern(
        text=body, kind=PatternKind.EXACT, body=body, relative=relative, windows=windows
    )


def _refuse_catch_all(pattern: ReadPattern) -> None:
    compile_pattern(pattern, home=_PROBE_HOME, workdir=_PROBE_WORKDIR)


def _check_breadth(compiled: CompiledPattern, home: str, where: str = "") -> None:
    """Refuse a pattern that matches `/`, the whole home, or paths all over the system."""
    home = _clean_root(home)
    if (
        compiled.matches("/")
        or compiled.matches(home or "/")
        or all(compiled.matches(p) for p in _ROOT_PROBES)
        or all(compiled.matches(home + t) for t in _HOME_PROBE_TAILS)
    ):
        raise ReadPathError(
            f"{compiled.pattern.text!r}{where}: matches the whole file system or the whole "
            "home; name the folders the agent needs"
        )


def normalize_pattern(text: str) -> str:
    """The canonical spelling of a pattern (raises ReadPathError when it is invalid)."""
    return parse_pattern(text).text


# ------------------------------------------------------------------------- compiling


def _glob_to_regex(parts: Sequence[str]) -> str:
    out: list[str] = []
    for part in parts:
        if part == "**":
            out.append("(?:/[^/]+)*")
            continue
        piece = ["/"]
        for ch in part:
            if ch == "*":
                piece.append("[^/]*")
            elif ch == "?":
                piece.append("[^/]")
            else:
                piece.append(re.escape(ch))
        out.append("".join(piece))
    return "".join(out)


def _clean_root(path: str) -> str:
    path = os.path.normpath(path)
    return "" if path == "/" else path


def compile_pattern(pattern: ReadPattern | str, *, home: str, workdir: str) -> CompiledPattern:
    """Bind a pattern to the agent user's `home` and the run's `workdir` (both absolute;
    pass real paths). Raises ReadPathError when a relative entry resolves to `/` or home."""
    if isinstance(pattern, str):
        pattern = parse_pattern(pattern)
    if not (os.path.isabs(home) and os.path.isabs(workdir)):
        raise ReadPathError("home and workdir must be absolute paths")
    if pattern.windows:
        return CompiledPattern(pattern, _NEVER)

    body = pattern.body
    if pattern.kind is PatternKind.REGEX:
        if body.startswith("~/"):
            body = re.escape(_clean_root(home)) + body[1:]
        compiled = CompiledPattern(pattern, re.compile(body))
        _check_breadth(compiled, home)
        return compiled

    if pattern.relative:
        lead, rest = _split_relative(body)
        root = os.path.normpath(os.path.join(workdir, *lead))
    elif body == "~" or body.startswith("~/"):
        root, rest = os.path.normpath(home), _components(body)[1:]
    else:
        root, rest = "/", _components(body)[1:]
    rest = [p for p in rest if p != ""]

    if pattern.kind is PatternKind.EXACT:
        base = os.path.normpath(os.path.join(root, *rest))
        compiled = CompiledPattern(pattern, re.compile(re.escape(base)), base=base)
    else:
        regex = re.escape(_clean_root(root)) + _glob_to_regex(rest)
        compiled = CompiledPattern(pattern, re.compile(regex or "/"))
    where = f" (from workdir {workdir})" if pattern.relative else ""
    _check_breadth(compiled, home, where)
    return compiled


def compile_grants(
    active: Iterable[str],
    *,
    home: str,
    workdir: str,
    hidden: Iterable[str] = (),
) -> ReadGrants:
    """Compile the active patterns (already declared-and-granted, see `active_patterns`)
    for one run. `home` and `workdir` are resolved with realpath here, because the paths
    later decided on are real paths. `hidden` paths (absolute or `~/`) are never readable,
    not even inside the workdir. Patterns that cannot be bound are left out (and listed in
    `rejected`): leaving a grant out can only refuse more."""
    real_home = os.path.realpath(home)
    real_workdir = os.path.realpath(workdir)
    compiled: list[CompiledPattern] = []
    rejected: list[tuple[str, str]] = []
    for text in active:
        try:
            compiled.append(compile_pattern(text, home=real_home, workdir=real_workdir))
        except ReadPathError as exc:
            rejected.append((text, str(exc)))
    named = [h for h in (_expand_home(h, real_home) for h in hidden) if h]
    # And where each leads: a ~/.ssh or ~/.claude kept elsewhere by a
    # dotfiles manager (a link to ~/dotfiles/ssh) is as hidden there, since
    # the paths decided on are real paths.
    hidden_abs = tuple(dict.fromkeys([*named, *(os.path.realpath(h) for h in named)]))
    return ReadGrants(
        workdir=real_workdir,
        home=real_home,
        patterns=tuple(compiled),
        hidden=tuple(h for h in hidden_abs if h),
        rejected=tuple(rejected),
    )


def _expand_home(path: str, home: str) -> str:
    if path == "~":
        return home
    if path.startswith("~/"):
        return os.path.normpath(home + path[1:])
    return os.path.normpath(path) if os.path.isabs(path) else ""


# -------------------------------------------------------------------------- deciding


def is_inside(path: str, base: str) -> bool:
    """True when `path` is `base` or below it (both normalized absolute paths)."""
    if base == "/":
        return path.startswith("/")
    return path == base or path.startswith(base + "/")


def _is_real_form(path: str) -> bool:
    # A real path is absolute and normalized: no '.', '..', '//' or trailing '/'.
    return path.startswith("/") and not path.startswith("//") and os.path.normpath(path) == path


def may_read(real: str, grants: ReadGrants) -> bool:
    """May the agent read `real`? `real` must already be the real path (symlinks resolved,
    ideally the real path of an opened descriptor). Readable: inside the workdir, or
    matched by an active pattern; never inside a hidden path. Anything not in real form
    (relative, with '.' or '..') is refused rather than guessed at."""
    if not _is_real_form(real):
        return False
    if any(is_inside(real, h) for h in grants.hidden):
        return False
    if is_inside(real, grants.workdir):
        return True
    return any(p.matches(real) for p in grants.patterns)


def may_write(real: str, grants: ReadGrants) -> bool:
    """Writing never leaves the workdir, whatever is granted."""
    if not _is_real_form(real):
        return False
    if any(is_inside(real, h) for h in grants.hidden):
        return False
    return is_inside(real, grants.workdir)


def real_path(path: str, *, workdir: str) -> str:
    """Resolve `path` (relative paths against `workdir`) to its real path.

    Racy by nature: a link may change after this returns. The broker must not rely on it;
    it opens the file and checks the descriptor's real path (`open_for_read`)."""
    return os.path.realpath(os.path.join(workdir, path))


def fd_real_path(fd: int) -> str:
    """The real path of an open descriptor, from /proc/self/fd (Linux)."""
    return os.readlink(f"/proc/self/fd/{fd}")


def open_for_read(path: str, grants: ReadGrants, *, directory: bool = False) -> int:
    """Open `path` for reading only if the real path of what was actually opened is
    readable under `grants`; return the descriptor (the caller closes it).

    The path is checked once before opening (so nothing outside the grants is even
    opened, such as a FIFO or a device) and again on the descriptor, which is what
    defeats a link swapped in between. Raises AccessDenied."""
    target = path if os.path.isabs(path) else os.path.join(grants.workdir, path)
    if not may_read(os.path.realpath(target), grants):
        raise AccessDenied(f"{path}: outside the workdir and not granted")
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    if directory:
        flags |= os.O_DIRECTORY
    fd = os.open(target, flags)
    try:
        real = fd_real_path(fd)
        mode = os.fstat(fd).st_mode
        if not may_read(real, grants):
            raise AccessDenied(f"{path}: resolves to {real}, outside the workdir and not granted")
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise AccessDenied(f"{path}: not a regular file or directory")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


# ------------------------------------------------------------- declared and granted


def _canonical(text: str) -> str | None:
    try:
        return normalize_pattern(text)
    except ReadPathError:
        return None


def active_patterns(
    declared: Sequence[str], granted: Iterable[str], *, allow_all: bool = False
) -> list[str]:
    """The declared patterns that a grant covers, as the blueprint wrote them, in
    declaration order. A grant covers a declaration when both spell the same pattern
    (after `normalize_pattern`): these checks compare patterns, never paths on disk.
    `allow_all` (config `allow_blueprint_read_paths = true`) grants every valid
    declaration. Invalid patterns are never active."""
    grants = {c for c in (_canonical(g) for g in granted) if c is not None}
    seen: set[str] = set()
    out: list[str] = []
    for text in declared:
        canon = _canonical(text)
        if canon is None or canon in seen:
            continue
        seen.add(canon)
        if allow_all or canon in grants:
            out.append(text)
    return out
