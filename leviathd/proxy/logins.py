"""The agent CLIs' own logins at the egress (issue 45 item 1).

A fenced agent behind the proxy never sees the user's real Claude Code,
Codex or Gemini CLI login:
- `plan` (spec building, in the planning thread): for each login file the
  user has in a folder any mount shows, that folder shown as a tmpfs of its
  host entries bound one by one with a read-only file of the agent's folder
  in the login's place (`_shown_by_entries` says why), and a mount of the
  login file itself given the placeholder; an API key the agent's
  environment would get (ANTHROPIC_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY)
  replaced by a placeholder of its shape;
- `start` (the agent's start, after polkit allowed it, in a worker thread):
  the login files read as the user (proxy/loginfiles.py: by descriptor, no
  link followed, bounded), their placeholder files written into the agent's
  folder (root's, read-only to the agent), and one `kind = "login"`
  injection per secret: the proxy's one injector (proxy/inject.py,
  proxy/tls.py) swaps a placeholder for the real value only toward the
  provider's hosts (`LoginFile.hosts`), over TLS it verified, and only in
  the header the CLI sends it in.
The real values live in the daemon's memory only (never in a spec, a
snapshot or the journal).

A login file's value is read again from the host's file at each request
that carries its placeholder (`read_secret`): a refresh done on the host, or
a daemon restart, keeps the agent's CLI working. An API key from the
environment is held in memory only (none after a daemon restart).

The CLI's own token refresh inside the agent (its refresh token travels in a
body, which is not swapped) is answered by the daemon (proxy/refresh.py).
Not done (docs/sandbox.md): a login done inside the agent.
"""

from __future__ import annotations

import functools
import os
import posixpath
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from leviathd import fsat, fsids
from leviathd.errors import InvalidArgument
from leviathd.gate.service import agent_dir
from leviathd.proxy import inject, refresh
from leviathd.proxy import loginfiles as clilogins
from leviathd.sandbox.spec import Mount, MountRole, SandboxSpec, host_resolve, is_within

KIND = "login"
# Every injection name of a login starts so; a configured credential's name
# cannot hold "/" (config/models.py Name), so none collides with one.
PREFIX = "login/"


@dataclass(frozen=True)
class EnvKey:
    header: str
    value: str
    hosts: tuple[str, ...]


# The variables each CLI reads its API key from, and how it sends it.
ENV_KEYS: dict[str, EnvKey] = {
    "ANTHROPIC_API_KEY": EnvKey("x-api-key", "{secret}", clilogins.LOGIN_FILES[0].hosts),
    "OPENAI_API_KEY": EnvKey("Authorization", "Bearer {secret}", ("api.openai.com",)),
    "GEMINI_API_KEY": EnvKey("x-goog-api-key", "{secret}",
                             ("generativelanguage.googleapis.com",)),
}
_SLUG = re.compile(r"[^a-z0-9]+")


def slug(tool: str) -> str:
    return _SLUG.sub("-", tool.lower()).strip("-")


def file_name(login_file: clilogins.LoginFile) -> str:
    """The placeholder file's name in the agent's folder."""
    return f"login-{slug(login_file.tool)}.json"


@dataclass
class Plan:
    """What one agent's specs were given: the login files bound (by tool)
    and each API key's placeholder with its real value."""

    files: dict[str, clilogins.LoginFile] = field(default_factory=dict)
    env: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)


# A login's folder is shown entry by entry; past this many the rest is left
# out (with a note): Claude Code's ~/.claude holds a dozen or two.
MAX_ENTRIES = 256


@dataclass(frozen=True)
class _Entry:
    name: str
    link: str | None  # a symlink's text, else None (a folder or a regular file)


def _enclosing(spec: SandboxSpec, folder: str) -> int | None:
    """The index of the bind or overlay that shows `folder` (the deepest,
    the last of equals: what lies on top), or None."""
    best: int | None = None
    for i, m in enumerate(spec.mounts):
        if m.kind in ("bind", "overlay") and m.target != "/" and is_within(folder, m.target) and (
                best is None or len(m.target) >= len(spec.mounts[best].target)):
            best = i
    return best


def _host_folders(spec: SandboxSpec, login_file: clilogins.LoginFile) -> tuple[str, ...]:
    """The login's folder on the host, by its name and where it leads (the
    fence's sources are resolved so, spec.host_resolve)."""
    named = posixpath.join(spec.home, *login_file.rel[:-1])
    return tuple(dict.fromkeys((named, host_resolve(named))))


def _views(spec: SandboxSpec, hosts: tuple[str, ...]) -> list[str]:
    """Every folder of the agent's view that a mount shows the login's host
    folder at: the state folder's own bind, and any other mount whose source
    holds it, by whatever name (a config mount of a link to ~/.claude, of a
    folder above it). Decided on the mounts' sources, not on the one place
    the fence puts the folder."""
    out: dict[str, None] = {}
    for m in spec.mounts:
        if m.kind not in ("bind", "overlay") or m.role == MountRole.ENTRY or m.target == "/":
            continue
        for host in hosts:
            if is_within(host, m.source):
                out[posixpath.normpath(posixpath.join(
                    m.target, posixpath.relpath(host, m.source)))] = None
    return list(out)


def refused(login_file: clilogins.LoginFile, where: str, why: str) -> InvalidArgument:
    """The start is refused rather than an agent shown the real login."""
    return InvalidArgument(
        f"{login_file.tool}'s login {where}: {why}, so an agent could read the real login; "
        "the start is refused (fix it on the host, or turn the placeholders off with "
        "[proxy] cli_logins = false in your config, docs/sandbox.md)")


def _open_folder(login_file: clilogins.LoginFile, source: str) -> int | None:
    """The folder opened as the user to be listed (fsat.open_dir: search
    rights on the folders above are enough, a /home of mode 0711 is
    common); None when it is not there. Any other failure refuses: a folder
    the fence can bind but the daemon cannot list must not be shown as it
    is."""
    try:
        return fsat.open_dir(source)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise refused(login_file, f"folder {source}", f"it cannot be listed ({exc.strerror})"
                      ) from None


def _check_login(login_file: clilogins.LoginFile, at: str, st: os.stat_result,
                 link_text: Callable[[], str]) -> None:
    """Refuses a login that is not one regular file of one name: a link, a
    file with several names, or a fifo or folder in its place. The CLIs
    write their login through a link or a hard link, and anything else
    there would read as "not logged in", leaving the folder shown as it is:
    an agent that had the folder while the user was logged out could have
    planted any of them to receive, or expose, her next login."""
    if stat.S_ISLNK(st.st_mode):
        raise refused(login_file, at, f"it is a link (to {link_text()[:200]!r}, which may "
                      "hold the real tokens)")
    if not stat.S_ISREG(st.st_mode):
        raise refused(login_file, at, "it is not a regular file")
    if st.st_nlink > 1:
        raise refused(login_file, at, "it has several names (hard links)")


def _entries(spec: SandboxSpec, login_file: clilogins.LoginFile,
             source: str) -> tuple[list[_Entry], bool] | None:
    """The folder's entries (but the login), listed as the user by
    descriptor: folders and regular files, and links by their text; None
    when the folder or the login is not there. The flag says entries were
    left out (past MAX_ENTRIES). A login that is not one regular file of
    one name refuses the start (_check_login)."""
    skip = login_file.rel[-1]
    with fsids.as_user(spec.uid, spec.gid):
        fd = _open_folder(login_file, source)
        if fd is None:
            return None
        try:
            st = fsat.lstat_at(fd, skip)
            if st is None:
                return None
            _check_login(login_file, posixpath.join(source, skip), st,
                         lambda: os.readlink(skip, dir_fd=fd))
            out: list[_Entry] = []
            names = sorted(os.listdir(fd))
            for name in names[:MAX_ENTRIES + 1]:
                # The login under another name is never an entry: a CLI's
                # write in progress (Claude Code writes `<login>.tmp.<hex>`
                # and renames it over the login: bound at the start, the new
                # login would stay in the agent's view), a backup.
                if name.startswith(skip):
                    continue
                try:
                    est = os.lstat(name, dir_fd=fd)
                    if stat.S_ISLNK(est.st_mode):
                        out.append(_Entry(name, os.readlink(name, dir_fd=fd)))
                    elif stat.S_ISDIR(est.st_mode) or stat.S_ISREG(est.st_mode):
                        out.append(_Entry(name, None))
                except OSError:
                    continue  # gone since the listing: a CLI's temporary file
            return out[:MAX_ENTRIES], len(names) > MAX_ENTRIES + 1
        except OSError as exc:
            raise refused(login_file, f"folder {source}", f"it cannot be listed ({exc.strerror})"
                          ) from None
        finally:
            os.close(fd)


def _placeholder_bind(target: str, placeholder: str, tool: str) -> Mount:
    return Mount("bind", target, placeholder, readonly=True, exact=True,
                 why=f"{tool}'s login: placeholders (the real tokens stay on the host)")


def _shown_by_entries(spec: SandboxSpec, folder: str, hosts: tuple[str, ...],
                      login_file: clilogins.LoginFile,
                      placeholder: str) -> tuple[int, list[Mount], str | None] | None:
    """The mounts that show the login's folder, seen at `folder`, with the
    placeholder file in the login's place, or None where what lies on top at
    `folder` is not the login's host folder or the login is not there.

    Not a bind of the placeholder over the host's file: a tool on the host
    that replaces the file by renaming a new one over it (Claude Code does
    so at each refresh) detaches every mount on that name in every mount
    namespace (Linux >= 3.18), and the agent would then read the real file.
    Here the folder the agent sees is a tmpfs of its own holding each host
    entry bound one by one (links as links), with the login a file the host
    cannot rename anything over. The folder's host entries made after the
    start are not seen, and top-level entries the agent makes are its own
    (docs/sandbox.md). A throwaway layer (an overlay) showing the folder
    refuses: its lower folder's new names come through."""
    at = _enclosing(spec, folder)
    if at is None:
        return None
    encl = spec.mounts[at]
    source = posixpath.normpath(posixpath.join(encl.source, posixpath.relpath(folder, encl.target)))
    if source not in hosts:
        return None
    listed = _entries(spec, login_file, source)
    if listed is None:
        return None
    login_at = posixpath.join(folder, login_file.rel[-1])
    if encl.kind == "overlay":
        # A throwaway layer shows its lower folder's names as they come (the
        # host CLI's `<login>.tmp.<hex>` during each refresh among them).
        raise refused(login_file, f"folder {source}", f"a throwaway layer shows it at {folder}")
    entries, cut = listed
    why = f"{login_file.tool}'s folder: host entries one by one, the login a placeholder"
    mounts = [Mount("tmpfs", folder, why=why)]
    for e in entries:
        target = posixpath.join(folder, e.name)
        if any(is_within(target, h) for h in spec.hidden):
            continue
        if e.link is not None:
            mounts.append(Mount("symlink", target, e.link, why=why))
        else:
            mounts.append(Mount("bind", target, posixpath.join(source, e.name),
                                readonly=encl.readonly, exact=True, why=why,
                                role=MountRole.ENTRY))
    mounts.append(_placeholder_bind(login_at, placeholder, login_file.tool))
    note = (f"{login_file.tool}: {folder} has over {MAX_ENTRIES} "
            "entries; the rest are not shown" if cut else None)
    return at, mounts, note


def plan(spec: SandboxSpec, plan_: Plan) -> SandboxSpec:
    """The login files covered and the keys' placeholders; `plan_` (the
    agent's, shared by its steps) keeps what `start` needs. A login is
    covered wherever a mount shows it: its folder, by any name, and a mount
    of the login file itself."""
    mounts = list(spec.mounts)
    env = dict(spec.env)
    notes = list(spec.notes)
    for login_file in clilogins.LOGIN_FILES:
        placeholder = posixpath.join(agent_dir(spec.execution_id), file_name(login_file))
        hosts = _host_folders(spec, login_file)
        logins_at = {posixpath.join(h, login_file.rel[-1]) for h in hosts}
        covered = False
        # A mount of the login file itself (a config mount, by any name); one
        # of the login under another name, inside its folder, is refused.
        for i, m in enumerate(mounts):
            if m.kind not in ("bind", "overlay") or m.role == MountRole.ENTRY:
                continue
            source = posixpath.normpath(m.source)
            if source in logins_at:
                mounts[i] = _placeholder_bind(m.target, placeholder, login_file.tool)
                covered = True
                continue
            inside = next((h for h in hosts if is_within(source, h) and source != h), None)
            if inside is not None and posixpath.relpath(source, inside).startswith(
                    login_file.rel[-1]):
                raise refused(login_file, f"mount {source}", "it is the login under another "
                              "name")
        for folder in _views(replace(spec, mounts=tuple(mounts)), hosts):
            shown = _shown_by_entries(replace(spec, mounts=tuple(mounts)), folder, hosts,
                                      login_file, placeholder)
            if shown is None:
                continue
            at, entry_mounts, cut = shown
            covered = True
            # Right above the mount that shows the folder: whatever the fence
            # puts later inside it (a mask, a protected file) still lies on top.
            mounts[at + 1:at + 1] = entry_mounts
            if cut:
                notes.append(cut)
        if not covered:
            continue
        plan_.files[login_file.tool] = login_file
        notes.append(f"{login_file.tool}'s login (~/{'/'.join(login_file.rel)}): the agent "
                     "sees placeholders, swapped for the real tokens at the proxy toward "
                     f"{', '.join(login_file.hosts)} only")
    for name, key in ENV_KEYS.items():
        real = env.get(name)
        if not real:
            continue
        known = plan_.env.get(name)
        if known is None or known[1] != real:
            known = plan_.env[name] = (clilogins.placeholder_for(real), real)
        env[name] = known[0]
        notes.append(f"{name}: the agent holds a placeholder, swapped for the key at the "
                     f"proxy toward {', '.join(key.hosts)} only ({key.header} header)")
    return replace(spec, mounts=tuple(mounts), env=env, notes=tuple(notes))


def _holds_login(spec: SandboxSpec, m: Mount, login_file: clilogins.LoginFile) -> bool:
    """Whether mount `m` shows the user's login (the file, under any name in
    its folder, or a folder that holds it), looked at as the user; a login
    that is not one regular file of one name refuses."""
    if m.kind not in ("bind", "overlay"):
        return False
    source = posixpath.normpath(m.source)
    for host in _host_folders(spec, login_file):
        login = posixpath.join(host, login_file.rel[-1])
        if source == login or (is_within(source, host) and posixpath.relpath(
                source, host).startswith(login_file.rel[-1])):
            return True
        if is_within(host, source):
            with fsids.as_user(spec.uid, spec.gid):
                try:
                    st = os.lstat(login)
                except FileNotFoundError:
                    continue
                except OSError:
                    return True  # cannot tell: withheld
                _check_login(login_file, login, st, functools.partial(os.readlink, login))
            return True
    return False


def withhold(spec: SandboxSpec) -> SandboxSpec:
    """A container agent: its engine binds host paths as they are, with no
    tmpfs of entries to put a placeholder in, so a mount that shows a CLI's
    login is left out, with every mount inside it (a writable mount of its
    settings.json would outlive the protection that went with it), and a
    note says so; so is an API key the agent's environment would pass (no
    placeholder is swapped for a container). Red team of issue 45: a
    blueprint may choose the container kind. A workdir that holds a login
    refuses the start."""
    mounts: list[Mount] = []
    notes = list(spec.notes)
    dropped: list[str] = []
    for m in spec.mounts:
        if any(is_within(m.target, d) for d in dropped):
            continue  # inside what is left out: binds, protections, masks
        hit = next((f for f in clilogins.LOGIN_FILES if _holds_login(spec, m, f)), None)
        if hit is not None:
            if m.role in (MountRole.WORKDIR, MountRole.WORKTREE_GIT):
                raise refused(hit, f"workdir {m.target}", "a container agent's workdir would "
                              "hold it as it is")
            dropped.append(m.target)
            notes.append(f"{m.target}: not shown to a container agent: it holds "
                         f"{hit.tool}'s login, which a container cannot be given as a "
                         "placeholder")
            continue
        mounts.append(m)
    env = dict(spec.env)
    for name in ENV_KEYS:
        if env.pop(name, None):
            notes.append(f"{name}: not passed to a container agent (no placeholder is swapped "
                         "for one)")
    return replace(spec, mounts=tuple(mounts), env=env, notes=tuple(notes))


_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _path_name(path: tuple[str, ...], index: int) -> str:
    """Where the value lies in the file, as the injection's name says it
    (so the egress reads it there again, after a refresh on the host or a
    daemon restart); a key it cannot spell safely gives the index alone
    (then the value is in memory only)."""
    if path and len(path) <= 4 and all(_KEY.match(k) for k in path):
        return "/".join(path)
    return f"#{index}"


def file_of(name: str) -> tuple[clilogins.LoginFile, tuple[str, ...]] | None:
    """The login file and the keys an injection's name points at (None for
    a key from the environment or a value held in memory only)."""
    if not name.startswith(PREFIX):
        return None
    tool, _, rest = name[len(PREFIX):].partition("/")
    found = next((f for f in clilogins.LOGIN_FILES if slug(f.tool) == tool), None)
    path = tuple(rest.split("/"))
    if found is None or not rest or not all(_KEY.match(k) for k in path):
        return None
    return found, path


def read_secret(name: str, memory: dict[str, str], uid: int, gid: int, home: str) -> str:
    """The real value of a login's injection (in a worker thread): read
    again, as the user, from the host's file where it lies (the CLI on the
    host may have refreshed it), else the value held since the start."""
    where = file_of(name)
    if where is not None:
        value = clilogins.read_value(uid, gid, home, where[0].rel, where[1])
        if value is not None:
            return value
    value = memory.get(name)
    if value is None:
        raise LookupError("the CLI's login is not on the host now (or the daemon restarted "
                          "since the agent started)")
    return value


@dataclass
class Started:
    injections: list[inject.Injection]
    secrets: dict[str, str] = field(repr=False)  # injection name -> real value
    notes: list[str]


def start(plan_: Plan, agent_id: str, uid: int, gid: int, home: str) -> Started:
    """In a worker thread, once the start is allowed: the logins read as the
    user, each planned file's placeholder written into the agent's folder
    (an empty object where the login could not be read now: the fence binds
    something, never the real file), and the injections."""
    logins, notes = clilogins.read_logins(uid, gid, home) if plan_.files else ([], [])
    by_tool = {login.tool: login for login in logins}
    injections: list[inject.Injection] = []
    secrets: dict[str, str] = {}
    fd = fsat.open_dir(agent_dir(agent_id))
    try:
        for tool, login_file in sorted(plan_.files.items()):
            login = by_tool.get(tool)
            data = login.placeholder if login is not None else b"{}\n"
            fsat.atomic_write_at(fd, file_name(login_file), data, mode=0o644)
            if login is None:
                notes.append(f"{tool}: its login could not be read now: the agent sees none")
                continue
            own: list[inject.Injection] = []
            for i, (ph, real) in enumerate(sorted(login.real.items())):
                name = f"{PREFIX}{slug(tool)}/{_path_name(login.paths.get(ph, ()), i)}"
                # A JWT's placeholder is known by its random signature: the
                # daemon's answer to a refresh gives the CLI the new claims
                # (its new `exp`) with the same signature (proxy/refresh.py).
                own.append(inject.Injection(
                    name=name, kind=KIND, hosts=login.hosts,
                    placeholder=clilogins.matched_by(ph),
                    header="Authorization", value="Bearer {secret}"))
                secrets[name] = real
            # Its token endpoint: the CLI's refresh answered by the daemon.
            injections += own + refresh.refresh_injections(slug(tool), own)
    finally:
        os.close(fd)
    for var, (ph, real) in sorted(plan_.env.items()):
        key = ENV_KEYS[var]
        name = f"{PREFIX}env/{var}"
        injections.append(inject.Injection(name=name, kind=KIND, hosts=key.hosts,
                                           placeholder=ph, header=key.header, value=key.value))
        secrets[name] = real
    return Started(injections, secrets, notes)
