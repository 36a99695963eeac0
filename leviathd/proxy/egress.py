"""Credentials injected at the egress, in the agent life cycle (issue 30).

For a `network = "proxy"` agent in a namespace or container sandbox with
credentials of kind "git" or "http" (or "cli" with `hosts`):
- a per-agent key (daemon memory and the proxy's root-only snapshot) from
  which each credential's placeholder is derived (proxy/inject.py);
- the sandbox's environment names the trust bundle (the system's CAs and
  the agent's own CA, `ca-bundle.pem` in its runtime folder, read-only at
  /run/leviath) in SSL_CERT_FILE, GIT_SSL_CAINFO, NODE_EXTRA_CA_CERTS,
  REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE, and a kind "http" credential's
  `token_env` holds its placeholder;
- the broker's git tools give git the placeholder, never the token; a
  container's git, which has no `lev` to ask the broker with, gets the
  placeholder from a credential helper in its git settings (`container_helper`);
- the proxy's Injector (proxy/server.py) holds the agent's CA (its key in
  memory only) and reads a secret through the broker when a request needs it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import replace

from leviathd import fsat
from leviathd.config.merge import Effective
from leviathd.config.models import CredentialConfig
from leviathd.domain.sandbox import SandboxKind
from leviathd.gate.service import CA_BUNDLE, SANDBOX_RUNTIME, agent_dir
from leviathd.proxy import azure, inject
from leviathd.sandbox import gitenv
from leviathd.sandbox.spec import SandboxSpec

BUNDLE = CA_BUNDLE.rsplit("/", 1)[1]  # its name in the agent's folder
# network = true: git's per-URL proxy for the covered hosts, written by the
# daemon once its loopback port is bound (and again after a restart, on a new
# port); the sandbox's git includes it (a missing file is no error to git).
GITCONFIG = "egress.gitconfig"
SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
TRUST_VARIABLES = ("SSL_CERT_FILE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS",
                   "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
MAX_SYSTEM_BUNDLE = 4 << 20
KINDS = ("git", "http", "azure")


def injected(credentials: Mapping[str, CredentialConfig]) -> dict[str, CredentialConfig]:
    """git and http, and a cli credential that names its `hosts`: that CLI
    (gh, glab) then runs inside the agent's own fence with the placeholder as
    its token (issue 30 item 3) instead of in the credential fence."""
    return {n: c for n, c in credentials.items()
            if c.kind in KINDS or (c.kind == "cli" and c.hosts)}


def inside(credentials: Mapping[str, CredentialConfig]) -> set[str]:
    """The cli credentials that run inside the agent's fence when injected,
    and the azure one whose `az` does (creds/service.py writes its sign-in
    wrapper)."""
    return ({n for n, c in injected(credentials).items() if c.kind == "cli"}
            | ({first} if (first := azure_first(credentials)) else set()))


def azure_first(credentials: Mapping[str, CredentialConfig]) -> str | None:
    """The azure credential the sandbox's AZURE_* and `az` are for: the first
    by name (one service principal per agent signs in; others are still
    injected toward their hosts for a client that signs in by hand)."""
    return next((n for n in sorted(credentials) if credentials[n].kind == "azure"), None)


def injections(credentials: Mapping[str, CredentialConfig], key: bytes
               ) -> tuple[inject.Injection, ...]:
    out: list[inject.Injection] = []
    for n, c in sorted(injected(credentials).items()):
        if c.kind == "azure":
            out += azure.injections(n, hosts=c.hosts, authority=c.authority,
                                    tenant=c.tenant or "", client_id=c.client_id or "", key=key)
            continue
        out.append(inject.Injection(
            name=n, kind=c.kind, hosts=tuple(c.hosts), placeholder=inject.placeholder(key, n),
            header=c.header if c.kind == "http" else "Authorization", value=c.value,
            username=c.username, access=tuple(c.access)))
    return tuple(out)


# The sandboxes whose only way out is the proxy: there the secret can stay in
# the daemon. Kind none has the host's network and no fence: only its git is
# injected, as network = true's (applies_direct; NONE_LIMITS says what that
# cannot promise).
FENCED = (SandboxKind.NAMESPACE, SandboxKind.CONTAINER)


def _runtime(spec: SandboxSpec) -> bool:
    return any(m.target == SANDBOX_RUNTIME and m.kind == "bind" for m in spec.mounts)


def applies(spec: SandboxSpec) -> bool:
    return spec.kind in FENCED and spec.proxy and _runtime(spec)


def applies_direct(spec: SandboxSpec) -> bool:
    """`network = true` in a namespace sandbox, or kind none (always the
    host's network): git's way to the covered hosts through the daemon's
    loopback port, whose peer check holds for any process in the agent's
    scope."""
    if spec.kind == SandboxKind.NONE:
        return True
    return spec.kind == SandboxKind.NAMESPACE and spec.network and not spec.proxy and _runtime(spec)


def folder(spec: SandboxSpec) -> str:
    """The agent's folder as its processes name it: /run/leviath in a
    namespace sandbox; kind none has no mounts, so the host's path."""
    return agent_dir(spec.execution_id) if spec.kind == SandboxKind.NONE else SANDBOX_RUNTIME


def git_only(credentials: Mapping[str, CredentialConfig]) -> dict[str, CredentialConfig]:
    """What a network = true agent gets injected: git, whose per-URL proxy
    setting sends only the covered hosts to the daemon. A program's token
    (kind http, cli) has no such setting: those stay as without the proxy."""
    return {n: c for n, c in injected(credentials).items() if c.kind == "git"}


def _not_injected(spec: SandboxSpec, kind: str) -> str:
    """Why a credential is not injected here, and what holds instead."""
    if spec.kind == SandboxKind.NONE:
        why = ("kind none has no fence: its processes use the host's network directly, "
               "so only git's per-URL proxy is set")
    elif spec.kind in FENCED:
        why = 'injection needs network = "proxy"'
    else:
        why = f"no injection in a {spec.kind} sandbox"
    if kind == "git":
        held = ("git's credential helper is given the token"
                if spec.kind != SandboxKind.CONTAINER else "not offered")
    elif kind == "cli":
        held = ("the wrapper runs it in the credential fence"
                if spec.kind != SandboxKind.CONTAINER else "not offered")
    else:
        held = "not offered"
    return f"not injected at the egress ({why}); {held}"


def extend_trust(spec: SandboxSpec) -> SandboxSpec:
    """The trust bundle's variables alone (the CLIs' logins, proxy/logins.py:
    their TLS is ended by the proxy with the agent's CA)."""
    bundle = f"{SANDBOX_RUNTIME}/{BUNDLE}"
    return replace(spec, env={**spec.env, **dict.fromkeys(TRUST_VARIABLES, bundle)})


def extend_env(spec: SandboxSpec, eff: Effective, key: bytes) -> SandboxSpec:
    """The trust bundle's variables and the kind "http" placeholders."""
    creds = injected(dict(eff.credentials))
    if not creds:
        return spec
    if applies_direct(spec) and git_only(creds):
        return _extend_direct(spec, creds)
    if not applies(spec):
        # What `lev inspect` says: no injection here, the old way holds.
        return replace(spec, notes=(*spec.notes, *(
            f"credential {n} (kind {c.kind}): {_not_injected(spec, c.kind)}"
            for n, c in sorted(creds.items()))))
    env = dict(spec.env)
    bundle = f"{SANDBOX_RUNTIME}/{BUNDLE}"
    for name in TRUST_VARIABLES:
        env[name] = bundle
    env = gitenv.append(env, ssh_rewrites(creds))
    if spec.kind == SandboxKind.CONTAINER:
        env = gitenv.append(env, container_helper(creds, key))
    notes = list(spec.notes)
    first = azure_first(creds)
    for name, c in sorted(creds.items()):
        if c.kind == "azure":
            if name == first:
                env.update(azure.env(tenant=c.tenant or "", client_id=c.client_id or "",
                                     authority=c.authority,
                                     secret_placeholder=inject.placeholder(key, name)))
            notes.append(f"credential {name} (kind azure): injected at the proxy toward "
                         f"{', '.join(c.hosts)} (Authorization: Bearer, a token for "
                         f"{c.scope} the daemon gets from {c.authority} for app "
                         f"{c.client_id} of tenant {c.tenant}); the sandbox holds a "
                         "placeholder" + (" in AZURE_CLIENT_SECRET and az signs in with it"
                                          if name == first else ""))
            continue
        if c.kind in ("http", "cli") and c.token_env:
            env[c.token_env] = inject.placeholder(key, name)
        what = ("git " + "+".join(c.access)) if c.kind == "git" else f"{c.header} header"
        notes.append(f"credential {name} (kind {c.kind}): injected at the proxy toward "
                     f"{', '.join(c.hosts)} ({what}); the sandbox holds a placeholder"
                     + (f" in {c.token_env}" if c.kind in ("http", "cli") and c.token_env
                        else "")
                     + ("; the real program runs in the agent's own fence" if c.kind == "cli"
                        else ""))
    return replace(spec, env=env, notes=tuple(notes))


def _extend_direct(spec: SandboxSpec, creds: Mapping[str, CredentialConfig]) -> SandboxSpec:
    """network = true: git includes the daemon's per-URL proxy file and
    trusts the bundle; the other kinds keep their old way (notes say so)."""
    env = dict(spec.env)
    base = folder(spec)
    for name in TRUST_VARIABLES:
        env[name] = f"{base}/{BUNDLE}"
    git = git_only(creds)
    env = gitenv.append(env, [("include.path", f"{base}/{GITCONFIG}"), *ssh_rewrites(git)])
    none = spec.kind == SandboxKind.NONE
    why = "kind none" if none else "network = true"
    notes = list(spec.notes)
    for name, c in sorted(creds.items()):
        if c.kind == "git":
            notes.append(f"credential {name} (kind git): injected at the proxy toward "
                         f"{', '.join(c.hosts)} (git {'+'.join(c.access)}); {why}: "
                         "git reaches these hosts through a loopback port of the daemon's "
                         "that serves only this agent; the sandbox holds a placeholder")
        else:
            notes.append(f"credential {name} (kind {c.kind}): not injected at the egress "
                         f"({why}: only git's per-URL proxy is set); "
                         + ("the wrapper runs it in the credential fence" if c.kind == "cli"
                            else "not offered"))
    if none:
        notes.append(NONE_LIMITS)
    return replace(spec, env=env, notes=tuple(notes))


# What `lev inspect` says a kind none agent's injection cannot promise
# (docs/security-model.md says it at length).
NONE_LIMITS = (
    "kind none cannot promise: the agent reads every file its user can (a secret_file or "
    "secret_command of the user's own config included), the user's processes outside the "
    "agent may ptrace it (kernel.yama.ptrace_scope), and its processes reach any host "
    "directly; the loopback port refuses the user's processes outside the agent's scope, "
    "and a secret of the machine config stays in the daemon")


def gitconfig(hosts: Iterable[str], port: int) -> bytes:
    """git's per-URL proxy for each host a git credential covers (git
    matches `*` as one whole host label, as the CA's constraint does)."""
    lines: list[str] = []
    for pattern in dict.fromkeys(hosts):
        if any(ch in pattern for ch in '?[]"\\\n\r\t ') or (
                "*" in pattern and not pattern.startswith("*.")):
            continue  # not a URL git matches as the proxy does: no injection there
        lines += [f'[http "https://{pattern}/"]', f"\tproxy = http://127.0.0.1:{port}"]
    return ("\n".join(lines) + "\n").encode()


def write_gitconfig(agent_id: str, data: bytes) -> None:
    fd = fsat.open_dir(agent_dir(agent_id))
    try:
        fsat.atomic_write_at(fd, GITCONFIG, data, mode=0o644)
    finally:
        os.close(fd)


def ssh_rewrites(creds: Mapping[str, CredentialConfig]) -> list[tuple[str, str]]:
    """The Legato spec: "git fetches with read tokens even when the
    repository's origin is an ssh address". For each host a git token covers
    (a plain name on 443), `git@HOST:` and `ssh://git@HOST/` are fetched
    over https (`url.<https>.insteadOf`); pushes too when the token may
    push, else they stay on ssh (`pushInsteadOf` to themselves)."""
    pairs: list[tuple[str, str]] = []
    for _name, c in sorted(creds.items()):
        if c.kind != "git":
            continue
        for pattern in c.hosts:
            if ":" in pattern or any(ch in pattern for ch in "*?[]"):
                continue
            https = f"https://{pattern}/"
            for ssh in (f"git@{pattern}:", f"ssh://git@{pattern}/"):
                pairs.append((f"url.{https}.insteadOf", ssh))
                if "push" not in c.access:
                    pairs.append((f"url.{ssh}.pushInsteadOf", ssh))
    return list(dict.fromkeys(pairs))


def container_helper(creds: Mapping[str, CredentialConfig], key: bytes
                     ) -> list[tuple[str, str]]:
    """git's credential helper in a container (its image has no `lev`): for
    each host a git credential covers, the helper list reset and then a
    shell helper that answers `get` with the user name and the placeholder,
    so `git credential fill` there gives the placeholder, never the token.
    (The proxy also injects into a request that carries no Authorization
    at all: git works without asking.) Patterns git cannot match (?, [..])
    get none; their hosts are still injected."""
    pairs: list[tuple[str, str]] = []
    for name, c in sorted(creds.items()):
        if c.kind != "git":
            continue
        answer = " ".join(shlex.quote(x) for x in (
            f"username={c.username}", f"password={inject.placeholder(key, name)}"))
        helper = f"!f() {{ test \"$1\" = get && printf '%s\\n' {answer}; }}; f"
        for pattern in c.hosts:
            if any(ch in pattern for ch in "?[]"):
                continue
            for scheme in ("https", "http") if c.allow_http else ("https",):
                pairs += [(f"credential.{scheme}://{pattern}.helper", ""),
                          (f"credential.{scheme}://{pattern}.helper", helper)]
    return list(dict.fromkeys(pairs))


def system_bundle() -> bytes:
    for path in SYSTEM_BUNDLES:
        try:
            with open(path, "rb") as f:
                return f.read(MAX_SYSTEM_BUNDLE)
        except OSError:
            continue
    return b""


def write_bundle(agent_id: str, ca_pem: bytes) -> None:
    """Into the agent's folder (root's, made by the gate), by descriptor."""
    data = system_bundle().rstrip(b"\n") + b"\n" + ca_pem
    fd = fsat.open_dir(agent_dir(agent_id))
    try:
        fsat.atomic_write_at(fd, BUNDLE, data, mode=0o644)
    finally:
        os.close(fd)
