"""Issue 45 item 1, the pure and file parts: the agent CLIs' logins become
placeholder files bound over the real ones and placeholder variables, the
egress swaps a login's placeholder only where it was sent, and only the
machine or user config turns it off (tests/integration/test_cli_logins.py
is the attacker's side, with the real Claude Code)."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from leviathd.config.load import parse_blueprint, parse_config
from leviathd.config.merge import resolve
from leviathd.domain.sandbox import SandboxKind
from leviathd.proxy import inject, logins
from leviathd.sandbox.spec import Mount, MountRole, SandboxSpec

ACCESS = "sk-ant-oat01-REALaccessREALaccessREALaccessREALaccess-xyz"
REFRESH = "sk-ant-ort01-REALrefreshREALrefreshREALrefreshREALrefresh"
API_KEY = "sk-ant-api03-REALkeyREALkeyREALkeyREALkeyREALkeyREALkey"


def _spec(home: str, **kw: object) -> SandboxSpec:
    base: dict[str, object] = dict(
        kind=SandboxKind.NAMESPACE, argv=("claude",), env={"PATH": "/usr/bin"}, workdir="/w",
        workdir_mode="rw", uid=os.getuid(), gid=os.getgid(), groups=(), user="u", home=home,
        sandbox_home=home, mounts=(Mount("bind", f"{home}/.claude", f"{home}/.claude"),),
        hidden=(), namespaces=(), network=False, scratch="/s", hostname="h",
        execution_id="0123abcd", proxy=True)
    base.update(kw)
    return SandboxSpec(**base)  # type: ignore[arg-type]


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / ".credentials.json").write_text(json.dumps({"claudeAiOauth": {
        "accessToken": ACCESS, "refreshToken": REFRESH, "expiresAt": 1, "scopes": ["x"]}}))
    return tmp_path


def test_a_bound_login_file_is_covered_by_a_placeholder_file_and_a_key_by_a_placeholder(
        home: Path) -> None:
    plan = logins.Plan()
    spec = logins.plan(_spec(str(home), env={"ANTHROPIC_API_KEY": API_KEY}), plan)
    cover = [m for m in spec.mounts if m.target == f"{home}/.claude/.credentials.json"]
    assert len(cover) == 1 and cover[0].readonly and cover[0].exact
    assert cover[0].source.endswith("/0123abcd/login-claude-code.json")
    ph = spec.env["ANTHROPIC_API_KEY"]
    assert ph != API_KEY and ph.startswith("sk-ant-api03-") and API_KEY[13:] not in ph
    assert API_KEY not in repr(spec) and API_KEY not in repr(plan)
    assert list(plan.files) == ["Claude Code"] and plan.env["ANTHROPIC_API_KEY"][1] == API_KEY
    # A second step of the same agent gets the same placeholder.
    again = logins.plan(_spec(str(home), env={"ANTHROPIC_API_KEY": API_KEY}), plan)
    assert again.env["ANTHROPIC_API_KEY"] == ph


def test_a_login_file_the_fence_does_not_show_or_that_is_missing_gets_no_bind(
        home: Path) -> None:
    plan = logins.Plan()
    spec = logins.plan(_spec(str(home), mounts=()), plan)
    assert not plan.files and len(spec.mounts) == 0
    (home / ".claude" / ".credentials.json").unlink()
    spec = logins.plan(_spec(str(home)), plan)
    assert not plan.files and len(spec.mounts) == 1


def test_start_writes_placeholders_and_keeps_the_real_values_for_the_egress(
        home: Path, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    agents = tmp_path_factory.mktemp("agents")
    (agents / "0123abcd").mkdir()
    monkeypatch.setattr(logins, "agent_dir", lambda agent_id: str(agents / agent_id))
    plan = logins.Plan()
    logins.plan(_spec(str(home), env={"ANTHROPIC_API_KEY": API_KEY}), plan)
    started = logins.start(plan, "0123abcd", os.getuid(), os.getgid(), str(home))
    shown = (agents / "0123abcd" / "login-claude-code.json").read_text()
    assert ACCESS not in shown and REFRESH not in shown
    oauth = json.loads(shown)["claudeAiOauth"]
    assert oauth["accessToken"].startswith("sk-ant-oat01-") and oauth["scopes"] == ["x"]
    by_ph = {i.placeholder: i for i in started.injections}
    access = by_ph[oauth["accessToken"]]
    assert started.secrets[access.name] == ACCESS and access.kind == "login"
    assert access.header == "Authorization" and "api.anthropic.com" in access.hosts
    key = next(i for i in started.injections if i.header == "x-api-key")
    assert started.secrets[key.name] == API_KEY and key.value == "{secret}"
    assert all(i.name.startswith(logins.PREFIX) for i in started.injections)


def _login(ph: str, header: str = "Authorization", value: str = "Bearer {secret}",
           name: str = "login/x/0") -> inject.Injection:
    return inject.Injection(name=name, kind="login", hosts=("api.anthropic.com",),
                            placeholder=ph, header=header, value=value)


def test_a_login_is_swapped_only_where_its_placeholder_was_sent() -> None:
    a, r = _login("sk-ant-oat01-PH1"), _login("sk-ant-ort01-PH2", name="login/x/1")
    k = _login("sk-ant-api03-PH3", header="x-api-key", value="{secret}", name="login/env/K")
    secrets = {a.name: "REAL-A", r.name: "REAL-R", k.name: "REAL-K"}
    req = inject.parse_head(b"POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\n"
                            b"Authorization: Bearer sk-ant-oat01-PH1")
    head, used = inject.rebuild(req, [a, r, k], secrets, host="api.anthropic.com")
    assert b"Authorization: Bearer REAL-A\r\n" in head and used == [a.name]
    assert b"REAL-R" not in head and b"REAL-K" not in head and b"x-api-key" not in head
    # No header of its own: a login puts none in (a configured http credential would).
    req = inject.parse_head(b"GET / HTTP/1.1\r\nHost: api.anthropic.com")
    head, used = inject.rebuild(req, [a, r, k], secrets, host="api.anthropic.com")
    assert used == [] and b"REAL" not in head
    # The key's placeholder in its own header; the access token's elsewhere is refused.
    req = inject.parse_head(b"GET / HTTP/1.1\r\nHost: a\r\nx-api-key: sk-ant-api03-PH3")
    head, used = inject.rebuild(req, [a, r, k], secrets, host="api.anthropic.com")
    assert b"x-api-key: REAL-K\r\n" in head and used == [k.name]
    req = inject.parse_head(b"GET / HTTP/1.1\r\nHost: a\r\nX-Echo: sk-ant-oat01-PH1")
    with pytest.raises(inject.Refusal):
        inject.rebuild(req, [a, r, k], secrets, host="api.anthropic.com")


def _merged(machine: str = "", user: str | None = None, blueprint: str = "") -> bool:
    bp = parse_blueprint(f'[agent]\nname = "a"\ncommand = ["run"]\n{blueprint}\n', "b.toml")
    return resolve(parse_config(machine, "m.toml"),
                   parse_config(user, "u.toml") if user is not None else None,
                   bp, "a").agent.proxy.cli_logins


def test_only_the_machine_or_user_config_turns_the_placeholders_off() -> None:
    off = "[proxy]\ncli_logins = false\n"
    assert _merged() is True
    assert _merged(machine=off) is False
    assert _merged(user=off) is False
    assert _merged(machine=off, user="[proxy]\ncli_logins = true\n") is False
    assert _merged(blueprint=off) is True


def test_the_egress_reads_a_login_again_from_the_host_file_and_a_key_from_memory(
        home: Path, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    agents = tmp_path_factory.mktemp("agents")
    (agents / "0123abcd").mkdir()
    monkeypatch.setattr(logins, "agent_dir", lambda agent_id: str(agents / agent_id))
    plan = logins.Plan()
    logins.plan(_spec(str(home), env={"ANTHROPIC_API_KEY": API_KEY}), plan)
    started = logins.start(plan, "0123abcd", os.getuid(), os.getgid(), str(home))
    names = {i.name for i in started.injections}
    access = "login/claude-code/claudeAiOauth/accessToken"
    assert access in names and "login/env/ANTHROPIC_API_KEY" in names

    def read(name: str, memory: dict[str, str]) -> str:
        return logins.read_secret(name, memory, os.getuid(), os.getgid(), str(home))

    assert read(access, {}) == ACCESS  # from the file, not from memory
    # The host's CLI refreshed: the new token goes out for the same placeholder.
    creds = home / ".claude" / ".credentials.json"
    creds.write_text(json.dumps({"claudeAiOauth": {"accessToken": "sk-ant-oat01-NEW"}}))
    assert read(access, started.secrets) == "sk-ant-oat01-NEW"
    assert read("login/env/ANTHROPIC_API_KEY", started.secrets) == API_KEY
    with pytest.raises(LookupError):
        read("login/env/ANTHROPIC_API_KEY", {})
    # A path the file no longer has, a link in the file's place: not read there.
    creds.write_text("{}")
    with pytest.raises(LookupError):
        read(access, {})
    creds.unlink()
    creds.symlink_to(home / "elsewhere.json")
    (home / "elsewhere.json").write_text(json.dumps({"claudeAiOauth": {"accessToken": "X" * 9}}))
    with pytest.raises(LookupError):
        read(access, {})
    assert logins.file_of("login/claude-code/a/../b") is None
    assert logins.file_of("login/nope/accessToken") is None


def test_the_login_folder_is_a_tmpfs_of_the_host_entries_with_the_placeholder_on_top(
        home: Path) -> None:
    """A bind over the login's name is detached by a rename on the host (the
    host's Claude Code refreshes so): the agent's ~/.claude is a tmpfs of its
    own, each host entry bound one by one (links as links), the login the
    placeholder; masks the fence puts inside still lie on top; nothing binds
    the host's login file."""
    claude = home / ".claude"
    (claude / "projects").mkdir()
    (claude / "history.jsonl").write_text("")
    (claude / "to-etc").symlink_to("/etc")
    os.mkfifo(claude / "a-fifo")
    # The login under another name: a host refresh's write in progress (to
    # be renamed over the login). Not an entry.
    (claude / ".credentials.json.tmp.9f3a").write_text("{}")
    mask = Mount("mask", f"{claude}/projects/hidden")
    spec = logins.plan(_spec(str(home), mounts=(
        Mount("bind", str(claude), str(claude)), mask)), logins.Plan())
    shown = [(m.kind, m.target, m.source, m.role) for m in spec.mounts]
    ph = spec.mounts[-2].source
    assert ph.endswith("/0123abcd/login-claude-code.json")
    assert shown == [
        ("bind", str(claude), str(claude), MountRole.OTHER),
        ("tmpfs", str(claude), "", MountRole.OTHER),
        ("bind", f"{claude}/history.jsonl", f"{claude}/history.jsonl", MountRole.ENTRY),
        ("bind", f"{claude}/projects", f"{claude}/projects", MountRole.ENTRY),
        ("symlink", f"{claude}/to-etc", "/etc", MountRole.OTHER),
        ("bind", f"{claude}/.credentials.json", ph, MountRole.OTHER),
        ("mask", mask.target, "", MountRole.OTHER),
    ], shown
    assert all(m.exact for m in spec.mounts if m.role == MountRole.ENTRY)
    assert spec.mounts[-2].readonly and spec.mounts[-2].exact


def test_a_folder_entry_gone_by_the_start_is_left_out_and_any_other_source_is_an_error(
        home: Path) -> None:
    from leviathd.sandbox.namespace.pinner import Pinner
    from leviathd.sandbox.namespace.syscalls import FenceError

    spec = _spec(str(home))
    pinner = Pinner(spec, -1, None)
    gone = f"{home}/.claude/gone"
    assert pinner.source(Mount("bind", gone, gone, exact=True, role=MountRole.ENTRY)) == -1
    with pytest.raises(FenceError, match="cannot open"):
        pinner.source(Mount("bind", gone, gone, exact=True))
    there = f"{home}/.claude/.credentials.json"
    fd = pinner.source(Mount("bind", there, there, exact=True, role=MountRole.ENTRY))
    assert fd >= 0
    os.close(fd)


def _unplanned(home: Path, user_config: str, workdir: Path, workdir_mode: str = "rw",
               blueprint: str = "") -> SandboxSpec:
    """The spec as the daemon builds it (merge, build_spec on this host)."""
    from leviathd.identity import UserInfo
    from leviathd.sandbox.spec import RunRequest, build_spec_on_host

    bp = parse_blueprint('[agent]\nname = "a"\ncommand = ["claude"]\n' + blueprint, "b.toml")
    eff = resolve(parse_config("", "m.toml"), parse_config(user_config, "u.toml"), bp, "a").agent
    me = UserInfo(name="u", uid=os.getuid(), gid=os.getgid(), groups=(), home=str(home))
    return build_spec_on_host(eff, me, RunRequest(("claude",), str(workdir), workdir_mode),  # type: ignore[arg-type]
                              "0123abcd", other_homes=[])


def _built(home: Path, user_config: str, workdir: Path,
           workdir_mode: str = "rw") -> SandboxSpec:
    """The spec as the daemon builds it, then the logins' plan."""
    spec = _unplanned(home, user_config, workdir, workdir_mode)
    return logins.plan(replace(spec, proxy=True), logins.Plan())


def _on_top(spec: SandboxSpec, target: str) -> Mount:
    """The last mount at `target` or above it: what the agent meets there."""
    from leviathd.sandbox.spec import is_within
    return [m for m in spec.mounts if is_within(target, m.target) and m.target != "/"][-1]


def test_a_login_is_covered_wherever_a_mount_shows_it(home: Path) -> None:
    """Attacker's side: a config mount of the login file itself lay on top of
    the placeholder; a ~/.claude that is a link elsewhere (dotfiles) is shown
    from where it leads. Each is covered: no mount takes the host's login
    file, and every name it would appear at holds the placeholder. (The
    folder under another name, a link to it, is refused: test_sandbox_spec.)"""
    dot = home / "dotfiles"
    dot.mkdir()
    (home / ".claude").rename(dot / "claude")
    (home / ".claude").symlink_to(dot / "claude")
    real = dot / "claude" / ".credentials.json"
    (home / "w").mkdir()
    spec = _built(home, '[sandbox]\nmounts = [{path = "~/.claude/.credentials.json"}]\n',
                  home / "w")
    assert not [m for m in spec.mounts if m.source == str(real)], spec.mounts
    top = _on_top(spec, str(home / ".claude" / ".credentials.json"))
    assert top.source.endswith("/0123abcd/login-claude-code.json") and top.readonly, top
    assert _on_top(spec, str(home / ".claude" / "x")).kind == "tmpfs"


def test_where_the_login_cannot_be_covered_the_start_is_refused(home: Path) -> None:
    """Red team: a throwaway layer shows its lower folder's new names (the
    host CLI's `.credentials.json.tmp.<hex>` at each refresh); a mount of
    the login under another name (a backup) lay over the folder's tmpfs; a
    login that is a link (its target shown elsewhere, and the CLIs write
    through it: an agent that had the folder while the user was logged out
    plants one) or a hard link. None is shown: the start is refused."""
    from leviathd.errors import InvalidArgument

    real = home / ".claude" / ".credentials.json"
    (home / "w").mkdir()
    (home / "wc").symlink_to(home / ".claude")
    with pytest.raises(InvalidArgument, match="under another name"):
        _built(home, "", home / "wc", "throwaway")
    # (The spec builder refuses that first; the plan refuses a layer anyway.)
    claude = str(home / ".claude")
    layer = Mount("overlay", f"{home}/wc", claude, upper="/s/u", work="/s/w")
    with pytest.raises(InvalidArgument, match="throwaway layer"):
        logins.plan(_spec(str(home), mounts=(layer,)), logins.Plan())
    (home / ".claude" / ".credentials.json.bak").write_text(real.read_text())
    with pytest.raises(InvalidArgument, match="under another name"):
        _built(home, '[sandbox]\nmounts = [{path = "~/.claude/.credentials.json.bak"}]\n',
               home / "w")
    (home / ".claude" / ".credentials.json.bak").unlink()
    os.link(real, home / "w" / "planted.json")
    with pytest.raises(InvalidArgument, match="several names"):
        _built(home, "", home / "w")
    (home / "w" / "planted.json").unlink()
    (home / "w" / "dot.json").write_text(real.read_text())
    real.unlink()
    real.symlink_to(home / "w" / "dot.json")
    with pytest.raises(InvalidArgument, match="is a link"):
        _built(home, "", home / "w")


def _extended(spec: SandboxSpec, blueprint: str, tmp_path: Path) -> SandboxSpec:
    """`spec` as the daemon's proxy feature extends it for an agent of
    `blueprint` (ProxyService.extend_effective, with no agents or gate)."""
    from types import SimpleNamespace

    from leviathd.proxy.service import ProxyService

    bp = parse_blueprint('[agent]\nname = "a"\ncommand = ["claude"]\n' + blueprint, "b.toml")
    eff = resolve(parse_config("", "m.toml"), None, bp, "a").agent
    (tmp_path / "state").mkdir(exist_ok=True)
    service = ProxyService(None, SimpleNamespace(broker_hooks=[]),  # type: ignore[arg-type]
                           state_dir=str(tmp_path / "state"))
    return service.extend_effective(spec, eff)


def test_a_step_with_no_network_shows_placeholders_too(home: Path, tmp_path: Path) -> None:
    """Red team: the cover ran only where the proxy applies, so a blueprint's
    `network = false` stage (a tightening: no finding) had ~/.claude as it
    is, read-write: it copied the real login into the workdir for a later
    proxied stage to send. Only a step with the host's network (the user's
    own choice) is left as it is."""
    (home / "w").mkdir()
    blueprint = "[sandbox]\nnetwork = false\n"
    bare = _unplanned(home, "", home / "w", blueprint=blueprint)
    assert not bare.proxy and not bare.network
    out = _extended(bare, blueprint, tmp_path)
    top = _on_top(out, f"{home}/.claude/.credentials.json")
    assert top.source.endswith("login-claude-code.json"), top
    assert _extended(replace(bare, network=True), blueprint, tmp_path).mounts == bare.mounts


def test_a_container_agent_is_not_shown_a_folder_that_holds_a_login(
        home: Path, tmp_path: Path) -> None:
    """Red team: a blueprint may raise the kind to container (a tightening:
    no finding), whose engine bound ~/.claude as it is, real login included.
    The folder is left out, with what would be protected inside it; a
    folder without a login is shown as before."""
    (home / "w").mkdir()
    (home / ".codex").mkdir()  # Codex installed, not logged in
    blueprint = '[sandbox]\nkind = "container"\n'
    spec = _unplanned(home, "", home / "w", blueprint=blueprint)
    assert [m for m in spec.mounts if m.target == f"{home}/.claude" and m.kind == "bind"]
    out = _extended(spec, blueprint, tmp_path)
    assert not [m for m in out.mounts if m.target.startswith(f"{home}/.claude/")
                or m.target == f"{home}/.claude"], out.mounts
    assert [m for m in out.mounts if m.target == f"{home}/.codex" and m.kind == "bind"]
    assert any("not shown to a container agent" in n for n in out.notes)


def test_a_container_agent_loses_every_mount_inside_a_withheld_folder_and_the_key(
        home: Path, tmp_path: Path) -> None:
    """Red team, round 2: withholding ~/.claude from a container kept a
    blueprint's writable mount of ~/.claude/settings.json (its protection
    went with the folder: hooks run on the host), a mount of the login
    under another name, and the real ANTHROPIC_API_KEY in its environment."""
    (home / "w").mkdir()
    (home / ".claude" / "settings.json").write_text("{}")
    (home / ".claude" / ".credentials.json.bak").write_text("{}")
    blueprint = ('[sandbox]\nkind = "container"\nmounts = [{path = "~/.claude/settings.json", '
                 'access = "write"}, {path = "~/.claude/.credentials.json.bak"}]\n')
    spec = _unplanned(home, "", home / "w", blueprint=blueprint)
    spec = replace(spec, env={**spec.env, "ANTHROPIC_API_KEY": API_KEY})
    out = _extended(spec, blueprint, tmp_path)
    assert not [m for m in out.mounts if m.target.startswith(f"{home}/.claude")], out.mounts
    assert "ANTHROPIC_API_KEY" not in out.env


def test_anything_but_one_regular_file_at_the_logins_name_refuses(home: Path) -> None:
    """Red team, round 2: a fifo or folder an agent planted at the login's
    name (its user logged out) read as "not logged in": the folder stayed
    shown as it is for every later agent. Refused, as a link is."""
    from leviathd.errors import InvalidArgument

    login = home / ".claude" / ".credentials.json"
    login.unlink()
    os.mkfifo(login)
    (home / "w").mkdir()
    with pytest.raises(InvalidArgument, match="not a regular file"):
        _built(home, "", home / "w")


def test_a_codex_jwt_placeholder_keeps_the_claims_and_is_swapped_by_its_signature(
        home: Path, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Codex decides when to refresh from its access token's `exp`: the
    placeholder keeps the claims; the injector knows it by its random
    signature, so the claims the daemon's refresh answer gives it (a new
    `exp`) still carry the real token out (proxy/refresh.py)."""
    def part(doc: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()
    real = f"{part({'alg': 'RS256'})}.{part({'exp': 1000})}.{'R' * 43}"
    (home / ".codex").mkdir()
    (home / ".codex" / "auth.json").write_text(json.dumps({"OPENAI_API_KEY": None, "tokens": {
        "access_token": real, "refresh_token": "rt_" + "R" * 40, "account_id": "a1"}}))
    agents = tmp_path_factory.mktemp("agents")
    (agents / "0123abcd").mkdir()
    monkeypatch.setattr(logins, "agent_dir", lambda agent_id: str(agents / agent_id))
    plan = logins.Plan()
    logins.plan(_spec(str(home), mounts=(Mount("bind", f"{home}/.codex", f"{home}/.codex"),)),
                plan)
    started = logins.start(plan, "0123abcd", os.getuid(), os.getgid(), str(home))
    shown = json.loads((agents / "0123abcd" / "login-codex.json").read_text())["tokens"]
    head, claims, sig = shown["access_token"].split(".")
    assert [head, claims] == real.split(".")[:2] and sig != "R" * 43
    access = next(i for i in started.injections
                  if i.name == "login/codex/tokens/access_token")
    assert access.placeholder == sig and started.secrets[access.name] == real
    # The CLI sends the new claims with the same signature: the real token goes.
    later = f"{head}.{part({'exp': 999999})}.{sig}"
    req = inject.parse_head(b"POST /backend-api/codex/responses HTTP/1.1\r\nHost: chatgpt.com"
                            b"\r\nAuthorization: Bearer " + later.encode())
    out, used = inject.rebuild(req, [access], {access.name: real}, host="chatgpt.com")
    assert f"Authorization: Bearer {real}\r\n".encode() in out and used == [access.name]
