"""Property tests: for any machine config, user config and blueprint, the merge never
loosens any axis. The oracle is the configs' own effective settings (no blueprint),
compared field by field with what the agent and every stage get."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from leviathd.config.merge import Effective, resolve
from leviathd.config.models import Blueprint, Config
from leviathd.domain.mounts import Access
from leviathd.domain.permission import Permission
from leviathd.domain.tools import TOOLS as REGISTRY
from leviathd.readpatterns import normalize_pattern

TOOLS = sorted({*REGISTRY, "made_up_tool"})
PRE_ALLOWABLE_TOOLS = frozenset(t.name for t in REGISTRY.values() if t.pre_allowable)
PATHS = ["~/data", "~/data/sub", "/srv", "/etc"]
PATTERNS = ["~/runs", "~/runs/", "glob:~/docs/**", "regex:/data/.*", "../shared", "/opt/x"]
AGENT = "a"

opt = st.none() | st.just(None)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


mounts = st.lists(
    st.fixed_dictionaries(
        {"path": st.sampled_from(PATHS), "access": st.sampled_from(["read", "write"])}
    ),
    max_size=3,
)


def sandbox_section(stage: bool = False) -> st.SearchStrategy[dict[str, Any]]:
    fields = {
        "kind": maybe(st.sampled_from(["none", "namespace", "container"])),
        "engine": maybe(st.sampled_from(["auto", "podman", "docker"])),
        "image": maybe(st.sampled_from(["debian:12", "alpine:3"])),
        "network": maybe(st.booleans()),
        "mounts": maybe(mounts),
        "default_mounts": maybe(st.booleans()),
        "on_unavailable": maybe(st.sampled_from(["error", "warn"])),
        "scratch_dir": maybe(st.sampled_from(["/big", "/tmp/x"])),
    }
    return st.fixed_dictionaries({}, optional=fields).map(
        lambda d: {k: v for k, v in d.items() if v is not None}
    )


resources = st.fixed_dictionaries(
    {},
    optional={
        "memory_max": st.sampled_from(["512M", "1G", "4G", "infinity", 1000]),
        "tasks_max": st.sampled_from([10, 100, 1000, "infinity"]),
        "cpu_quota": st.sampled_from(["50%", "100%", "400%"]),
        "cpu_weight": st.sampled_from([1, 100, 10000]),
    },
)
levels = st.sampled_from(["allow", "ask", "deny"])
perm_table = st.dictionaries(st.sampled_from(TOOLS), levels, max_size=4)

configs = st.fixed_dictionaries(
    {},
    optional={
        "sandbox": sandbox_section(),
        "resources": resources,
        "security": st.fixed_dictionaries(
            {},
            optional={
                "read_paths": st.lists(st.sampled_from(PATTERNS), max_size=3),
                "allow_blueprint_read_paths": st.booleans(),
                "hidden_paths": st.lists(st.sampled_from(PATHS), max_size=2),
                "env_pass": st.lists(st.sampled_from(["LANG", "TOKEN"]), max_size=2),
                "env_withhold": st.lists(st.sampled_from(["TOKEN", "SECRET"]), max_size=2),
            },
        ),
        "agent_read_paths": st.dictionaries(
            st.sampled_from([AGENT, "other"]),
            st.fixed_dictionaries({"allow": st.lists(st.sampled_from(PATTERNS), max_size=3)}),
            max_size=2,
        ),
        "tool_permissions": perm_table,
        "agent_tool_permissions": st.dictionaries(
            st.sampled_from([AGENT, "other"]), perm_table, max_size=2
        ),
        "taint": st.fixed_dictionaries(
            {},
            optional={
                "enabled": st.booleans(),
                "on_exceed": levels,
                "budget": st.integers(1, 100),
                "approval_timeout": st.integers(1, 600),
                "clearance": st.dictionaries(
                    st.sampled_from(["http_post", "web_fetch"]),
                    st.sampled_from(["public", "internal", "private"]),
                ),
                "allow_private_addresses": st.booleans(),
            },
        ),
    },
).map(Config.model_validate)

stage_names = st.lists(
    st.sampled_from(["analyze", "plan", "review", "ship"]), unique=True, max_size=3
)


@st.composite
def blueprints(draw: st.DrawFn) -> Blueprint:
    data: dict[str, Any] = {"agent": {"name": AGENT, "version": "1", "command": ["run"]}}
    if draw(st.booleans()):
        data["sandbox"] = draw(sandbox_section())
    data["stages"] = {}
    for name in draw(stage_names):
        stage: dict[str, Any] = {"command": [name]}
        if draw(st.booleans()):
            stage["sandbox"] = draw(sandbox_section(stage=True))
        data["stages"][name] = stage
    data["permissions"] = draw(perm_table)
    data["resources"] = draw(resources)
    data["read_paths"] = {"allow": draw(st.lists(st.sampled_from(PATTERNS), max_size=4))}
    return Blueprint.model_validate(data)


def _inside(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def assert_no_looser(
    eff: Effective,
    base: Effective,
    *,
    opt_in: bool,
    own_mounts: list[Any] | None,
    web_configured: bool,
) -> None:
    assert eff.kind.rank >= base.kind.rank
    assert eff.engine == base.engine
    if not base.network:
        assert not eff.network
    if not base.default_mounts:
        assert not eff.default_mounts
    assert eff.on_unavailable.rank >= base.on_unavailable.rank
    assert eff.scratch_dir == base.scratch_dir
    if opt_in:
        # The spec's exception: no [sandbox] in any config, so the blueprint's own
        # mounts (exactly the paths it lists) may apply, read-only.
        read_only = [m.model_copy(update={"access": Access.READ}) for m in own_mounts or []]
        assert eff.mounts == base.mounts or (own_mounts is not None and eff.mounts == read_only)
    else:
        assert eff.image == base.image
        for m in eff.mounts:
            assert any(
                _inside(m.path, b.path) and m.access.rank <= b.access.rank for b in base.mounts
            ), (m, base.mounts)
    for name in ("memory_max", "tasks_max", "cpu_quota", "cpu_weight"):
        limit = getattr(base.resources, name)
        if limit is not None:
            got = getattr(eff.resources, name)
            assert got is not None and got <= limit, name
    for tool, level in base.permissions.items():
        assert eff.permissions[tool].rank >= level.rank, tool
    for tool, level in eff.permissions.items():
        if tool not in base.permissions and level is Permission.ALLOW:
            assert tool in PRE_ALLOWABLE_TOOLS and not web_configured, tool
    # Everything the configs alone decide is untouched by the blueprint.
    assert eff.taint == base.taint
    assert eff.hidden_paths == base.hidden_paths
    assert eff.env_withhold == base.env_withhold
    assert eff.env_pass == base.env_pass
    assert eff.credentials == base.credentials
    assert eff.allowlist == base.allowlist


def _grants(machine: Config, user: Config | None) -> tuple[set[str], bool]:
    out: set[str] = set()
    allow_all = False
    for c in (machine, user):
        if c is None:
            continue
        out |= {normalize_pattern(p) for p in c.security.read_paths}
        if AGENT in c.agent_read_paths:
            out |= {normalize_pattern(p) for p in c.agent_read_paths[AGENT].allow}
        allow_all = allow_all or bool(c.security.allow_blueprint_read_paths)
    return out, allow_all


_READ_MOUNT = Config.model_validate({"sandbox": {"mounts": [{"path": "~/data"}]}})
_WRITE_ASK = Blueprint.model_validate(
    {
        "agent": {"name": AGENT, "command": ["run"]},
        "sandbox": {"mounts": [{"path": "~/data", "access": "write"}], "network": True},
    }
)


@given(machine=configs, user=maybe(configs), blueprint=blueprints())
@example(machine=_READ_MOUNT, user=None, blueprint=_WRITE_ASK)
@settings(max_examples=600, deadline=None)
def test_the_merge_never_loosens_any_axis_for_any_user_config_and_blueprint(
    machine: Config, user: Config | None, blueprint: Blueprint
) -> None:
    base = resolve(machine, user, None, AGENT).agent
    result = resolve(machine, user, blueprint, AGENT)
    opt_in = machine.sandbox is None and (user is None or user.sandbox is None)
    configured = set(machine.tool_permissions) | set(machine.agent_tool_permissions.get(AGENT, {}))
    if user is not None:
        configured |= set(user.tool_permissions) | set(user.agent_tool_permissions.get(AGENT, {}))
    web_configured = bool(configured & PRE_ALLOWABLE_TOOLS)

    top_mounts = blueprint.sandbox.mounts if blueprint.sandbox else None
    assert_no_looser(
        result.agent, base, opt_in=opt_in, own_mounts=top_mounts, web_configured=web_configured
    )
    assert list(result.stages) == list(blueprint.stages)
    for name, eff in result.stages.items():
        stage_sb = blueprint.stages[name].sandbox
        own = stage_sb.mounts if stage_sb and stage_sb.mounts is not None else top_mounts
        assert_no_looser(eff, base, opt_in=opt_in, own_mounts=own, web_configured=web_configured)
        assert eff.read_paths_granted == result.agent.read_paths_granted

    # Read paths: granted is a subset of declared, and each is granted by a config.
    grants, allow_all = _grants(machine, user)
    declared = [normalize_pattern(p) for p in result.agent.read_paths_declared]
    for p in result.agent.read_paths_granted:
        assert normalize_pattern(p) in declared
        assert allow_all or normalize_pattern(p) in grants
    # Every overruled loosening is reported.
    if blueprint.sandbox and blueprint.sandbox.engine is not None:
        assert any(f.code == "engine-discarded" for f in result.findings)


@given(machine=configs, user=configs)
@settings(max_examples=500, deadline=None)
def test_a_user_config_only_tightens_the_machine_config(machine: Config, user: Config) -> None:
    m = resolve(machine, None, None, AGENT).agent
    u = resolve(machine, user, None, AGENT).agent
    assert u.kind.rank >= m.kind.rank
    assert u.engine == m.engine
    assert m.network or not u.network
    assert m.default_mounts or not u.default_mounts
    assert u.on_unavailable.rank >= m.on_unavailable.rank
    assert u.scratch_dir == m.scratch_dir
    if machine.sandbox is not None:
        assert u.image == m.image
        for mount in u.mounts:
            assert any(
                _inside(mount.path, b.path) and mount.access.rank <= b.access.rank for b in m.mounts
            )
    for name in ("memory_max", "tasks_max", "cpu_quota", "cpu_weight"):
        limit = getattr(m.resources, name)
        if limit is not None:
            assert getattr(u.resources, name) is not None
            assert getattr(u.resources, name) <= limit
    for tool, level in m.permissions.items():
        assert u.permissions[tool].rank >= level.rank
    assert u.taint.enabled >= m.taint.enabled
    assert u.taint.on_exceed.rank >= m.taint.on_exceed.rank
    assert u.taint.allow_private_addresses <= m.taint.allow_private_addresses
    assert u.taint.budget >= m.taint.budget
    assert u.taint.approval_timeout <= m.taint.approval_timeout
    for tool, sens in m.taint.clearance.items():
        assert u.taint.clearance[tool].rank <= sens.rank
    assert set(m.hidden_paths) <= set(u.hidden_paths)
    assert set(m.env_withhold) <= set(u.env_withhold)
    assert not set(u.env_pass) & set(u.env_withhold)
