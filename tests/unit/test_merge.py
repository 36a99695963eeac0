"""Tighten-only merging, axis by axis, and the findings for every overruled loosening."""

from __future__ import annotations

from pathlib import Path

from leviathd.config.load import load_blueprint, load_config, parse_blueprint, parse_config
from leviathd.config.merge import Effective, MergeResult, resolve
from leviathd.config.models import (
    Config,
    OnUnavailable,
    Permission,
    SandboxKind,
    TaintPolicy,
)
from leviathd.domain.engine import Engine
from leviathd.domain.mounts import Access, MountRequest
from leviathd.domain.sensitivity import Sensitivity

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def cfg(text: str) -> Config:
    return parse_config(text, "config.toml")


def bp(extra: str = "", *, stages: str = "") -> object:
    return parse_blueprint(f'[agent]\nname = "a"\ncommand = ["run"]\n{extra}\n{stages}', "b.toml")


def run(
    machine: str = "", blueprint: str = "", user: str | None = None, stages: str = ""
) -> MergeResult:
    return resolve(
        cfg(machine),
        cfg(user) if user is not None else None,
        bp(blueprint, stages=stages),  # type: ignore[arg-type]
        "a",
    )


def codes(r: MergeResult) -> list[str]:
    return [f.code for f in r.findings]


# ------------------------------------------------------------------ sandbox kind


def test_with_nothing_configured_an_agent_gets_the_documented_defaults() -> None:
    e = resolve(Config(), None, None, "a").agent
    assert e == Effective()
    assert e.kind is SandboxKind.NAMESPACE
    # Issue 30: a fenced agent's own network is the proxy unless a config says true.
    assert e.network == "proxy" and e.default_mounts is True
    assert e.on_unavailable is OnUnavailable.ERROR
    assert e.taint.budget == 32 and e.taint.approval_timeout == 120
    assert e.taint.on_exceed is TaintPolicy.ASK


def test_a_blueprint_may_choose_a_stricter_kind() -> None:
    assert run("", '[sandbox]\nkind = "container"').agent.kind is SandboxKind.CONTAINER


def test_a_manifest_cannot_widen_a_sandbox_the_user_configured() -> None:
    r = run('[sandbox]\nkind = "container"', '[sandbox]\nkind = "none"')
    assert r.agent.kind is SandboxKind.CONTAINER
    assert "sandbox-kind-overruled" in codes(r)
    (f,) = [f for f in r.findings if f.code == "sandbox-kind-overruled"]
    assert f.level == "warn"
    assert "kind = 'none' is looser than your config's 'container'" in f.message


def test_a_blueprint_cannot_turn_the_default_namespace_into_no_sandbox() -> None:
    r = run("", '[sandbox]\nkind = "none"')
    assert r.agent.kind is SandboxKind.NAMESPACE
    assert "sandbox-kind-overruled" in codes(r)


def test_a_stage_may_differ_from_the_blueprint_but_never_go_below_the_config() -> None:
    r = run(
        "",
        '[sandbox]\nkind = "container"',
        stages='[stages.analyze]\ncommand = ["ls"]\n[stages.analyze.sandbox]\nkind = "none"\n'
        '[stages.build]\ncommand = ["make"]\n',
    )
    assert r.agent.kind is SandboxKind.CONTAINER
    assert r.stages["build"].kind is SandboxKind.CONTAINER  # inherits the blueprint's
    assert r.stages["analyze"].kind is SandboxKind.NAMESPACE  # config's floor, not none
    (f,) = [f for f in r.findings if f.code == "sandbox-kind-overruled"]
    assert "blueprint [stages.analyze.sandbox] kind = 'none'" in f.message
    assert r.stages["analyze"].command == ["ls"]


def test_stages_keep_the_blueprints_order() -> None:
    r = run(stages="".join(f'[stages.{n}]\ncommand = ["{n}"]\n' for n in ("z", "a", "m")))
    assert list(r.stages) == ["z", "a", "m"]


def test_a_user_config_cannot_loosen_the_machines_kind_but_may_raise_it() -> None:
    r = resolve(cfg('[sandbox]\nkind = "namespace"'), cfg('[sandbox]\nkind = "none"'), None, "a")
    assert r.agent.kind is SandboxKind.NAMESPACE
    assert "user config [sandbox] kind = 'none'" in r.findings[0].message
    r = resolve(cfg('[sandbox]\nkind = "none"'), cfg('[sandbox]\nkind = "container"'), None, "a")
    assert r.agent.kind is SandboxKind.CONTAINER


# ------------------------------------------------------------------ engine, image


def test_a_blueprints_engine_is_always_discarded() -> None:
    r = run('[sandbox]\nengine = "podman"', '[sandbox]\nkind = "container"\nengine = "docker"')
    assert r.agent.engine is Engine.PODMAN
    assert "engine-discarded" in codes(r)
    r = run("", '[sandbox]\nengine = "podman"')
    assert r.agent.engine is Engine.AUTO
    assert "engine-discarded" in codes(r)


def test_a_users_engine_is_discarded_too_because_the_engine_is_the_admins_choice() -> None:
    r = resolve(cfg('[sandbox]\nengine = "podman"'), cfg('[sandbox]\nengine = "docker"'), None, "a")
    assert r.agent.engine is Engine.PODMAN
    assert codes(r) == ["engine-discarded"]


def test_with_no_sandbox_of_the_users_own_a_blueprint_may_opt_in_with_image_and_mounts() -> None:
    r = run(
        "",
        '[sandbox]\nkind = "container"\nimage = "alpine:3"\n'
        'mounts = [{ path = "~/data", access = "write" }]',
    )
    assert r.agent.image == "alpine:3"
    # Read-only: a blueprint never makes a host folder writable (red team of
    # issue 45: ~/.local/bin or ~/.config/systemd, what the host runs next).
    assert r.agent.mounts == [MountRequest(path="~/data", access=Access.READ)]
    assert r.agent.blueprint_sandbox is True
    (note,) = [f for f in r.findings if f.code == "blueprint-mounts"]
    assert note.level == "note" and "~/data (write)" in note.message
    (warn,) = [f for f in r.findings if f.code == "blueprint-mounts-read-only"]
    assert warn.level == "warn" and "~/data" in warn.message


def test_with_a_sandbox_of_the_users_own_the_blueprints_image_is_discarded() -> None:
    r = run('[sandbox]\nkind = "container"\nimage = "debian:12"', '[sandbox]\nimage = "evil:1"')
    assert r.agent.image == "debian:12"
    assert "image-discarded" in codes(r)
    assert r.agent.blueprint_sandbox is False


# ------------------------------------------------------------------ network, mounts


def test_network_only_narrows() -> None:
    assert run("", "[sandbox]\nnetwork = false").agent.network is False
    r = run("[sandbox]\nnetwork = false", "[sandbox]\nnetwork = true")
    assert r.agent.network is False
    assert "network-overruled" in codes(r)


def test_a_blueprint_keeps_only_mounts_inside_the_users_with_no_more_access() -> None:
    machine = '[sandbox]\nmounts = [{ path = "~/data" }, { path = "/srv/cache", access = "write" }]'
    r = run(
        machine,
        '[sandbox]\nmounts = [{ path = "~/data/sub" }, { path = "~/data", access = "write" },'
        ' { path = "/srv/cache" }, { path = "/etc" }]',
    )
    assert r.agent.mounts == [
        MountRequest(path="~/data/sub"),
        MountRequest(path="~/data", access=Access.READ),
        MountRequest(path="/srv/cache", access=Access.READ),
    ]
    assert codes(r).count("mount-access-overruled") == 1
    assert codes(r).count("mount-overruled") == 1
    assert any("/etc (read) is not among the mounts" in f.message for f in r.findings)


def test_a_blueprint_without_mounts_gets_the_users_and_an_empty_list_removes_them() -> None:
    machine = '[sandbox]\nmounts = [{ path = "~/data" }]'
    assert run(machine, "").agent.mounts == [MountRequest(path="~/data")]
    assert run(machine, "[sandbox]\nmounts = []").agent.mounts == []


def test_default_mounts_and_on_unavailable_only_tighten() -> None:
    r = run("[sandbox]\ndefault_mounts = false", "[sandbox]\ndefault_mounts = true")
    assert r.agent.default_mounts is False
    assert "default-mounts-overruled" in codes(r)
    r = run("", '[sandbox]\non_unavailable = "warn"')
    assert r.agent.on_unavailable is OnUnavailable.ERROR
    assert "on-unavailable-overruled" in codes(r)
    r = run('[sandbox]\non_unavailable = "warn"', '[sandbox]\non_unavailable = "error"')
    assert r.agent.on_unavailable is OnUnavailable.ERROR
    assert "on-unavailable-overruled" not in codes(r)


def test_only_the_machine_sizes_scratch() -> None:
    r = run('[sandbox]\nscratch_size = "256M"', '[sandbox]\nscratch_size = "100G"')
    assert r.agent.scratch_size == 256 << 20
    assert "scratch-dir-ignored" in codes(r)
    r = resolve(cfg(""), cfg('[sandbox]\nscratch_size = "100G"'), None, "a")
    assert r.agent.scratch_size is None


def test_only_the_machine_chooses_the_scratch_dir() -> None:
    r = run('[sandbox]\nscratch_dir = "/big"', '[sandbox]\nscratch_dir = "/tmp/mine"')
    assert r.agent.scratch_dir == "/big"
    assert "scratch-dir-ignored" in codes(r)
    r = resolve(cfg(""), cfg('[sandbox]\nscratch_dir = "/etc"'), None, "a")
    assert r.agent.scratch_dir is None
    assert codes(r) == ["scratch-dir-ignored"]


# ------------------------------------------------------------------ resources


def test_resources_only_get_lower() -> None:
    r = run(
        '[resources]\nmemory_max = "1G"\ntasks_max = 100',
        '[resources]\nmemory_max = "4G"\ntasks_max = 50\ncpu_quota = "50%"',
    )
    assert r.agent.resources.memory_max == 1024**3
    assert r.agent.resources.tasks_max == 50
    assert r.agent.resources.cpu_quota == 50
    (f,) = [f for f in r.findings if f.code == "resource-overruled"]
    assert "memory_max = 4294967296 is above the limit of 1073741824" in f.message


def test_a_user_cannot_raise_the_machines_limits() -> None:
    r = resolve(
        cfg("[resources]\ncpu_weight = 100"), cfg("[resources]\ncpu_weight = 500"), None, "a"
    )
    assert r.agent.resources.cpu_weight == 100
    assert codes(r) == ["resource-overruled"]


# ------------------------------------------------------------------ permissions


def test_permissions_only_get_stricter() -> None:
    r = run(
        '[tool_permissions]\nshell = "ask"\nhttp_post = "ask"',
        '[permissions]\nshell = "allow"\nhttp_post = "deny"',
    )
    assert r.agent.permissions == {"shell": Permission.ASK, "http_post": Permission.DENY}
    (f,) = [f for f in r.findings if f.code == "permission-overruled"]
    assert "shell = 'allow' is looser than your config's 'ask'" in f.message


def test_a_blueprint_may_pre_allow_web_fetch_where_the_user_did_not_set_it() -> None:
    r = run("", '[permissions]\nweb_fetch = "allow"')
    assert r.agent.permissions == {"web_fetch": Permission.ALLOW}
    assert "permission-overruled" not in codes(r)


def test_the_web_exception_ends_once_the_user_configures_web_fetch() -> None:
    r = run('[tool_permissions]\nweb_fetch = "ask"', '[permissions]\nweb_fetch = "allow"')
    assert r.agent.permissions["web_fetch"] is Permission.ASK
    assert "permission-overruled" in codes(r)


def test_credential_store_is_ignored_and_said_so() -> None:
    r = run('[security]\ncredential_store = "keyring"', "", '[security]\ncredential_store = "x"')
    assert codes(r) == ["credential-store-ignored", "credential-store-ignored"]


def test_web_search_is_not_a_tool() -> None:
    # Issue 21 §8: it was accepted in configs, pre-allowable, and refused by the gate.
    r = run('[tool_permissions]\nweb_search = "allow"', "")
    assert codes(r) == ["unknown-tool"]  # and the gate refuses unknown tools
    r = run("", '[permissions]\nweb_search = "allow"')
    assert "web_search" not in r.agent.permissions
    assert codes(r) == ["unknown-tool", "permission-not-applied"]


def test_a_blueprint_cannot_pre_allow_any_other_tool() -> None:
    r = run("", '[permissions]\nshell = "allow"\nwrite_file = "ask"')
    assert r.agent.permissions == {"write_file": Permission.ASK}
    assert "permission-not-applied" in codes(r)


def test_per_agent_permissions_apply_to_that_agent_only() -> None:
    machine = cfg('[tool_permissions]\nshell = "deny"\n[agent_tool_permissions.a]\nshell = "ask"')
    assert resolve(machine, None, None, "a").agent.permissions["shell"] is Permission.ASK
    assert resolve(machine, None, None, "b").agent.permissions["shell"] is Permission.DENY


def test_a_user_cannot_loosen_the_machines_permissions() -> None:
    r = resolve(
        cfg('[tool_permissions]\nshell = "deny"'),
        cfg('[agent_tool_permissions.a]\nshell = "allow"'),
        None,
        "a",
    )
    assert r.agent.permissions["shell"] is Permission.DENY
    assert codes(r) == ["permission-overruled"]


def test_unknown_tool_names_are_findings() -> None:
    r = run('[tool_permissions]\nshel = "deny"', '[permissions]\nsend_rockets = "ask"')
    msgs = [f.message for f in r.findings if f.code == "unknown-tool"]
    assert any("machine config [tool_permissions]: unknown tool 'shel'" in m for m in msgs)
    assert any("blueprint [permissions]: unknown tool 'send_rockets'" in m for m in msgs)


# ------------------------------------------------------------------ taint, security


def test_taint_settings_from_the_user_only_tighten() -> None:
    machine = cfg(
        '[taint]\nenabled = true\non_exceed = "ask"\nbudget = 64\napproval_timeout = 60\n'
        'clearance = { http_post = "internal" }'
    )
    user = cfg(
        '[taint]\nenabled = false\non_exceed = "allow"\nbudget = 8\napproval_timeout = 600\n'
        'clearance = { http_post = "private", web_fetch = "public" }\n'
        "allow_private_addresses = true"
    )
    t = resolve(machine, user, None, "a").agent.taint
    assert t.enabled is True
    assert t.on_exceed is TaintPolicy.ASK
    assert t.budget == 64 and t.approval_timeout == 60
    assert t.clearance == {"http_post": Sensitivity.INTERNAL, "web_fetch": Sensitivity.PUBLIC}
    stricter = cfg('[taint]\non_exceed = "deny"\nbudget = 128\napproval_timeout = 10')
    t = resolve(machine, stricter, None, "a").agent.taint
    assert (t.on_exceed, t.budget, t.approval_timeout) == (TaintPolicy.DENY, 128, 10)


def test_hidden_paths_and_withheld_names_add_up_and_withholding_wins() -> None:
    machine = cfg('[security]\nhidden_paths = ["/srv/secrets"]\nenv_withhold = ["TOKEN"]')
    user = cfg('[security]\nhidden_paths = ["~/.private"]\nenv_pass = ["TOKEN", "LANG"]')
    e = resolve(machine, user, None, "a").agent
    assert e.hidden_paths == ["/srv/secrets", "~/.private"]
    assert e.env_pass == ["LANG"]
    assert e.env_withhold == ["TOKEN"]


def test_a_user_credential_cannot_replace_the_machines() -> None:
    machine = cfg('[credentials.gh]\ncommand = ["gh"]\nsecret_file = "/etc/leviath/gh"\n'
                  'env = "GH_TOKEN"')
    user = cfg(
        '[credentials.gh]\ncommand = ["gh"]\nsecret_file = "/tmp/x"\nenv = "GH_TOKEN"\n'
        '[credentials.mine]\ncommand = ["tool"]\nsecret_command = ["pass"]\nenv = "T"'
    )
    r = resolve(machine, user, None, "a")
    assert r.agent.credentials["gh"].secret_file == "/etc/leviath/gh"
    assert "mine" in r.agent.credentials
    assert codes(r) == ["credential-overruled"]


# ------------------------------------------------------------------ read paths


def test_the_spec_example_reports_one_granted_and_one_not_granted_read_path() -> None:
    blueprint = load_blueprint(FIXTURES / "blueprints" / "cto")
    user = load_config(FIXTURES / "configs" / "cto-user.toml")
    r = resolve(Config(), user, blueprint, "cto")
    assert r.agent.read_paths_declared == ["~/.leviath/runs", "glob:~/design-docs/**"]
    assert r.agent.read_paths_granted == ["~/.leviath/runs"]
    assert [(f.level, f.code) for f in r.findings] == [
        ("warn", "read-paths-not-granted"),
        ("note", "read-paths-declared"),
    ]
    warn, note = r.findings
    assert (
        warn.hint
        == 'add to your config.toml: [agent_read_paths.cto] allow = ["glob:~/design-docs/**"]'
    )
    assert note.message.endswith("2 declared, 1 granted")
    assert note.hint == "~/.leviath/runs: granted; glob:~/design-docs/**: NOT granted"
    assert list(r.stages) == ["analyze", "plan", "review"]
    assert r.stages["review"].network is False
    assert r.seed == [["git", "status", "--short"]]


def test_machine_wide_grants_apply_only_to_declared_patterns() -> None:
    r = run('[security]\nread_paths = ["~/runs", "~/other"]', '[read_paths]\nallow = ["~/runs"]')
    assert r.agent.read_paths_granted == ["~/runs"]
    assert "read-paths-not-granted" not in codes(r)


def test_a_grant_for_another_agent_does_not_apply() -> None:
    r = run('[agent_read_paths.b]\nallow = ["~/runs"]', '[read_paths]\nallow = ["~/runs"]')
    assert r.agent.read_paths_granted == []


def test_a_user_may_grant_read_paths_for_the_users_own_agents() -> None:
    r = run(
        "",
        '[read_paths]\nallow = ["~/runs", "~/docs"]',
        user='[agent_read_paths.a]\nallow = ["~/docs"]',
    )
    assert r.agent.read_paths_granted == ["~/docs"]


def test_allow_blueprint_read_paths_trusts_every_declaration() -> None:
    r = run("[security]\nallow_blueprint_read_paths = true", '[read_paths]\nallow = ["~/a", "/b"]')
    assert r.agent.read_paths_granted == ["~/a", "/b"]
    assert "read-paths-not-granted" not in codes(r)


def test_an_agent_specific_grant_the_blueprint_never_declares_is_pointed_out() -> None:
    r = run('[agent_read_paths.a]\nallow = ["~/x"]', "")
    assert codes(r) == ["read-path-grant-unused"]


def test_a_windows_pattern_is_flagged_as_never_matching() -> None:
    r = run("", '[read_paths]\nallow = ["regex:C:/data/.*"]')
    assert "bad-read-path" in codes(r)


def test_blueprint_env_and_seed_pass_through() -> None:
    r = run("", '[env]\nMODE = "x"\n[seed]\ncommands = [["git", "init"]]')
    assert r.agent.env == {"MODE": "x"}
    assert r.seed == [["git", "init"]]
    assert r.agent.command == ["run"]


def test_a_user_cannot_raise_a_clearance_the_machine_leaves_at_its_default() -> None:
    # Issue 21 §7: http_get's default is internal; the machine sets nothing.
    r = resolve(cfg(""), cfg('[taint]\nclearance = { http_get = "private", shell = "public" }'),
                None, "a")
    assert r.agent.taint.clearance == {"shell": Sensitivity.PUBLIC}
    assert codes(r) == ["taint-overruled"]
    assert "http_get = 'private' is above the machine's 'internal'" in r.findings[0].message


def test_an_allowlist_rule_for_tool_star_is_said_to_match_nothing() -> None:
    r = run('[[allowlist]]\ntool = "*"\ntarget = "*"\nmax_sensitivity = "private"')
    assert codes(r) == ["allowlist-star"]
    assert "matches nothing" in r.findings[0].message


def test_a_user_cannot_shrink_the_taint_ledger_below_the_default() -> None:
    r = resolve(cfg(""), cfg("[taint]\nbudget = 2\napproval_timeout = 9999"), None, "a")
    assert r.agent.taint.budget == 32
    assert r.agent.taint.approval_timeout == 120
    assert codes(r) == ["taint-overruled", "taint-overruled"]
