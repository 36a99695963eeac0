"""Parse-level checks of what the distro installs around the Python code: the systemd
units, the D-Bus policy, the polkit actions and rules, sysusers and tmpfiles.

These need no root and no running systemd; whether the files actually work is shown in
the test bed (tests/integration). What they guard against here is drift: an action the
code asks polkit about that the policy file does not declare, a bus interface the D-Bus
policy would refuse, a unit that lost Type=notify, a folder mode loosened by accident."""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "units"
POLKIT = ROOT / "polkit"
CODE = ROOT / "leviathd"

BUS_NAME = "org.leviath.Manager1"
BRIEF_ACTIONS = {
    "org.leviath.agent.run",
    "org.leviath.agent.run-unsandboxed",
    "org.leviath.agent.manage-any",
    "org.leviath.config.manage",
    "org.leviath.approval.answer-any",
}
ADMIN_ACTIONS = BRIEF_ACTIONS - {"org.leviath.agent.run"}

# polkit action ids: lower-case dotted words with dashes (org.leviath.agent.run).
_ACTION_RE = re.compile(r"""["'](org\.leviath\.[a-z][a-z-]*\.[a-z][a-z-]*)["']""")
# Bus interfaces: a capitalised name ending in a version number (org.leviath.Policy1).
_IFACE_RE = re.compile(r"""["'](org\.leviath\.[A-Z][A-Za-z]*[0-9]+)["']""")


def unit_entries(path: Path) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit file as {section: [(key, value), ...]}, keeping repeated keys."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"{path.name}: {line!r} is outside any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is not key=value"
        current.append((key.strip(), value.strip()))
    return sections


def values(entries: list[tuple[str, str]], key: str) -> list[str]:
    return [v for k, v in entries if k == key]


def single(entries: list[tuple[str, str]], key: str) -> str:
    found = values(entries, key)
    assert len(found) == 1, f"{key} set {len(found)} times: {found}"
    return found[0]


def service() -> list[tuple[str, str]]:
    return unit_entries(UNITS / "leviathd.service")["Service"]


def declared_actions() -> dict[str, ET.Element]:
    tree = ET.parse(POLKIT / "org.leviath.policy")
    return {a.attrib["id"]: a for a in tree.getroot().iter("action")}


def strings_in_code(pattern: re.Pattern[str]) -> set[str]:
    found: set[str] = set()
    for path in CODE.rglob("*.py"):
        found.update(pattern.findall(path.read_text()))
    return found


# --- leviathd.service --------------------------------------------------------------


def test_the_service_is_ready_only_when_it_has_told_systemd_so() -> None:
    s = service()
    assert single(s, "Type") == "notify"
    assert single(s, "BusName") == BUS_NAME
    assert single(s, "ExecStart") == "/usr/bin/leviathd"


def test_restarting_the_daemon_does_not_kill_agents_or_their_sockets() -> None:
    s = service()
    # Agents live in their own scopes; only control-group (the default) also
    # kills helpers that were never moved into a scope.
    assert values(s, "KillMode") in ([], ["control-group"])
    assert single(s, "RuntimeDirectory") == "leviath"
    assert single(s, "RuntimeDirectoryPreserve") == "yes"
    assert single(s, "PrivateTmp") == "no"


def test_the_service_keeps_only_the_capabilities_its_comments_justify() -> None:
    s = service()
    caps = {c for line in values(s, "CapabilityBoundingSet") for c in line.split()}
    needed = {"CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_SYS_CHROOT"}
    assert needed <= caps
    never = {"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_BOOT", "CAP_SYS_TIME", "CAP_BPF",
             "CAP_SYSLOG", "CAP_MAC_ADMIN", "CAP_MAC_OVERRIDE"}
    assert not caps & never
    assert all(not c.startswith("~") for c in caps), "a deny-list bounding set keeps too much"
    text = (UNITS / "leviathd.service").read_text()
    for cap in caps:
        assert re.search(rf"^#\s+{cap}\s+\S", text, re.M), f"{cap} kept without a reason"


def test_hardening_that_would_break_agents_is_not_switched_on() -> None:
    s = service()
    # Inherited by every agent: these would break the sandbox or ordinary programs.
    for key in ("ProtectHostname", "MemoryDenyWriteExecute", "PrivateDevices"):
        assert values(s, key) in ([], ["no"]), key
    assert single(s, "ProtectHome") == "no"
    for key in ("ProtectKernelModules", "ProtectKernelLogs", "ProtectClock",
                "RestrictRealtime", "LockPersonality"):
        assert single(s, key) == "yes", key
    assert single(s, "SystemCallArchitectures") == "native"
    # /etc is read-only for the daemon, except the machine config it manages.
    assert single(s, "ProtectSystem") == "full"
    assert "/etc/leviath" in single(s, "ReadWritePaths").split()


def test_the_syscall_deny_list_and_device_acl_hold_what_analyze_credits() -> None:
    """Issue 33 item 6 (systemd-analyze security 6.6 -> 6.3): the groups its
    other settings refuse anyway are named in the deny list; the groups the
    fence or agents need are not denied."""
    s = service()
    denied = set(single(s, "SystemCallFilter").lstrip("~").split())
    assert {"@reboot", "@swap", "@obsolete", "@raw-io", "@cpu-emulation", "@clock",
            "@module"} <= denied
    assert not denied & {"@privileged", "@mount", "@debug", "@resources", "@process"}
    # "closed" took /dev/fuse from podman's fuse-overlayfs (test_container.py).
    assert values(s, "DevicePolicy") in ([], ["auto"])


def test_the_service_installs_as_the_target_of_bus_activation() -> None:
    unit = unit_entries(UNITS / "leviathd.service")
    alias = single(unit["Install"], "Alias")
    activation = unit_entries(UNITS / "org.leviath.Manager1.dbus-service")["D-BUS Service"]
    assert single(activation, "Name") == BUS_NAME
    assert single(activation, "User") == "root"
    assert single(activation, "SystemdService") == alias


def test_the_slice_caps_all_agents_together_and_leaves_room_for_the_rest() -> None:
    # Issue 10 §3: a cap over every agent, relative so it fits any machine.
    entries = dict(unit_entries(UNITS / "leviath.slice")["Slice"])
    for key in ("MemoryMax", "TasksMax"):
        value = entries[key]
        assert value.endswith("%") and 0 < int(value[:-1]) < 100, (key, value)
    assert entries["MemorySwapMax"] == "0"
    assert int(entries["CPUWeight"]) < 100


# --- D-Bus policy ------------------------------------------------------------------


def bus_policies() -> list[ET.Element]:
    return list(ET.parse(UNITS / "org.leviath.Manager1.conf").getroot().iter("policy"))


def test_only_root_may_own_the_bus_name() -> None:
    owners = []
    for policy in bus_policies():
        for rule in policy:
            if rule.tag == "allow" and {"own", "own_prefix"} & rule.attrib.keys():
                owners.append((dict(policy.attrib), dict(rule.attrib)))
    assert owners == [({"user": "root"}, {"own": BUS_NAME})]


def test_anyone_may_call_every_interface_the_code_exports_and_polkit_decides() -> None:
    default = [p for p in bus_policies() if p.attrib == {"context": "default"}]
    assert len(default) == 1
    allowed = {
        rule.attrib.get("send_interface")
        for rule in default[0]
        if rule.tag == "allow" and rule.attrib.get("send_destination") == BUS_NAME
    }
    assert None not in allowed, "an allow without send_interface opens every interface"
    standard = {f"org.freedesktop.DBus.{n}" for n in ("Introspectable", "Properties", "Peer")}
    wanted = {"org.leviath.Manager1", "org.leviath.Policy1"} | strings_in_code(_IFACE_RE)
    missing = (standard | wanted) - allowed
    assert not missing, f"the D-Bus policy would refuse calls to {sorted(missing)}"
    # Nothing in the default context may deny: a deny there would override polkit.
    assert not [r for r in default[0] if r.tag == "deny"]


# --- polkit ------------------------------------------------------------------------


def test_every_action_the_code_asks_polkit_about_is_declared() -> None:
    in_code = strings_in_code(_ACTION_RE)
    missing = (BRIEF_ACTIONS | in_code) - set(declared_actions())
    assert not missing, f"asked of polkit but not declared: {sorted(missing)}"


def test_every_declared_action_says_something_a_person_understands() -> None:
    for action_id, action in declared_actions().items():
        description = action.findtext("description", "").strip()
        message = action.findtext("message", "").strip()
        assert len(description) > 10 and len(message) > 30, action_id
        defaults = action.find("defaults")
        assert defaults is not None, action_id
        for key in ("allow_any", "allow_inactive", "allow_active"):
            assert defaults.findtext(key) in {
                "no", "yes", "auth_self", "auth_self_keep", "auth_admin", "auth_admin_keep"
            }, (action_id, key)


def test_no_action_is_granted_to_everyone_by_default() -> None:
    for action_id, action in declared_actions().items():
        defaults = action.find("defaults")
        assert defaults is not None
        granted = [e.tag for e in defaults if (e.text or "").strip() in {"yes", "auth_self",
                                                                          "auth_self_keep"}]
        assert not granted, f"{action_id} lets anyone through: {granted}"
    unsandboxed = declared_actions()["org.leviath.agent.run-unsandboxed"].find("defaults")
    assert unsandboxed is not None
    assert {e.text for e in unsandboxed} == {"auth_admin"}, "asked every time, never kept"


def rules_text() -> str:
    return (POLKIT / "50-leviath.rules").read_text()


def test_the_rules_let_group_leviath_run_agents_and_nothing_more() -> None:
    text = rules_text()
    m = re.search(r'isInGroup\("leviath"\)([^\n]*)\n\s*return polkit\.Result\.YES', text)
    assert m, "group leviath is not granted anything"
    assert '"org.leviath.agent.run"' in m.group(1)
    assert m.group(1).count("org.leviath.") == 1


def test_the_rules_give_group_leviath_admin_every_admin_action() -> None:
    text = rules_text()
    start = text.index('isInGroup("leviath-admin")')
    block = text[start : text.index("}", text.index("return polkit.Result.YES", start))]
    assert set(re.findall(r'"(org\.leviath\.[a-z.-]+)"', block)) >= ADMIN_ACTIONS


def test_the_rules_are_es5_that_polkitd_can_load() -> None:
    code = "\n".join(line.split("//")[0] for line in rules_text().splitlines())
    for es6 in (r"\blet\b", r"\bconst\b", r"=>", r"`"):
        assert not re.search(es6, code), f"{es6} is not ES5 (polkitd uses duktape)"
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: cannot check the rules file's syntax")
    result = subprocess.run(
        [node, "--check", "--input-type=commonjs", "-"],
        input=rules_text(), capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr


def test_the_rules_name_only_groups_that_sysusers_creates() -> None:
    created = {
        line.split()[1]
        for line in (UNITS / "leviath.sysusers.conf").read_text().splitlines()
        if line.strip() and not line.startswith("#") and line.split()[0] == "g"
    }
    named = set(re.findall(r'isInGroup\("([^"]+)"\)', rules_text()))
    assert named == {"leviath", "leviath-admin"} == created


# --- tmpfiles ----------------------------------------------------------------------


def test_state_and_runtime_folders_have_the_modes_that_keep_agents_apart() -> None:
    entries = {}
    for line in (UNITS / "leviath.tmpfiles.conf").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            kind, path, mode, user, group, age = line.split()
            entries[path] = (kind, mode, user, group, age)
    assert entries == {
        "/var/lib/leviath": ("d", "0711", "root", "root", "-"),
        "/var/lib/leviath/scratch": ("d", "0711", "root", "root", "-"),
        "/var/lib/leviath/agents": ("d", "0700", "root", "root", "-"),
        "/run/leviath": ("d", "0755", "root", "root", "-"),
        "/etc/leviath": ("d", "0755", "root", "root", "-"),
    }
    s = service()
    assert single(s, "StateDirectoryMode") == entries["/var/lib/leviath"][1]
    assert single(s, "RuntimeDirectoryMode") == entries["/run/leviath"][1]
