"""The spec's flowchart at the pure level: permission → reads outside the
workdir → taint against clearance → run."""

from __future__ import annotations

from pathlib import Path

import pytest

from leviathd.domain.sensitivity import Sensitivity
from leviathd.policy.approvals import OnceApproval, SessionApprovals
from leviathd.policy.decision import Call, decide
from leviathd.policy.ledger import Ledger
from leviathd.policy.settings import CompiledPolicy, PolicySettings

P, N, X = Sensitivity.PUBLIC, Sensitivity.INTERNAL, Sensitivity.PRIVATE


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[str, str]:
    home = tmp_path / "home"
    work = tmp_path / "work"
    (home / "notes").mkdir(parents=True)
    work.mkdir()
    return str(home), str(work)


def policy(dirs: tuple[str, str], **kw: object) -> CompiledPolicy:
    home, work = dirs
    kw.setdefault("taint_enabled", True)
    return CompiledPolicy(PolicySettings(**kw), home=home, workdir=work)  # type: ignore[arg-type]


def test_a_denied_tool_is_refused(dirs: tuple[str, str]) -> None:
    d = decide(policy(dirs, permissions={"web_fetch": "deny"}), Call("web_fetch", "x.org"), P)
    assert (d.outcome, d.rule) == ("deny", "permission:web_fetch=deny")


def test_an_unknown_tool_is_refused_even_when_configured_allow(dirs: tuple[str, str]) -> None:
    d = decide(policy(dirs, permissions={"launch_missiles": "allow"}), Call("launch_missiles"), P)
    assert (d.outcome, d.rule) == ("deny", "unknown-tool")


def test_an_unreadable_permission_value_fails_closed(dirs: tuple[str, str]) -> None:
    d = decide(policy(dirs, permissions={"http_get": "maybe"}), Call("http_get", "x.org"), P)
    assert d.outcome == "deny"


def test_an_asked_tool_asks_then_runs_after_a_once_approval(dirs: tuple[str, str]) -> None:
    pol = policy(dirs, permissions={"http_get": "ask"})
    call = Call("http_get", "x.org")
    first = decide(pol, call, P)
    assert (first.outcome, first.ask_kind) == ("ask", "permission")
    once = OnceApproval(SessionApprovals(), "permission", "http_get", "x.org", P)
    assert decide(pol, call, P, once).outcome == "allow"
    # A once answer is not remembered: a fresh decision asks again.
    assert decide(pol, call, P, SessionApprovals()).outcome == "ask"


def test_a_session_approval_covers_later_calls_of_the_tool(dirs: tuple[str, str]) -> None:
    pol = policy(dirs, permissions={"http_get": "ask"})
    session = SessionApprovals(tools={"http_get"})
    assert decide(pol, Call("http_get", "y.org"), P, session).outcome == "allow"


def test_a_read_outside_the_workdir_without_a_grant_is_refused(dirs: tuple[str, str]) -> None:
    home, _ = dirs
    path = f"{home}/notes/a.md"
    d = decide(policy(dirs), Call("read_file", path, (path,)), P)
    assert (d.outcome, d.rule) == ("deny", "read-path-not-granted")


def test_a_granted_read_is_allowed_and_labelled_private(dirs: tuple[str, str]) -> None:
    home, _ = dirs
    path = f"{home}/notes/a.md"
    pol = policy(dirs, read_paths=["~/notes"])
    d = decide(pol, Call("read_file", path, (path,)), P)
    assert d.outcome == "allow"
    assert d.label is X
    ledger = Ledger(8)
    ledger.add("read_file", path, d.label)
    assert ledger.taint is X


def test_a_workdir_read_without_grants_is_internal(dirs: tuple[str, str]) -> None:
    _, work = dirs
    d = decide(policy(dirs), Call("read_file", f"{work}/x", (f"{work}/x",)), P)
    assert (d.outcome, d.label) == ("allow", N)


def test_one_ungranted_path_refuses_a_whole_read_files_call(dirs: tuple[str, str]) -> None:
    _, work = dirs
    paths = (f"{work}/a", "/etc/shadow")
    assert decide(policy(dirs), Call("read_files", " ".join(paths), paths), P).outcome == "deny"


def test_writes_never_leave_the_workdir_even_where_reads_are_granted(
    dirs: tuple[str, str],
) -> None:
    home, _ = dirs
    path = f"{home}/notes/a.md"
    pol = policy(dirs, read_paths=["~/notes"])
    d = decide(pol, Call("write_file", path, (path,)), P)
    assert (d.outcome, d.rule) == ("deny", "write-outside-workdir")


def test_hidden_paths_are_refused_even_inside_the_workdir(dirs: tuple[str, str]) -> None:
    _, work = dirs
    pol = policy(dirs, hidden_paths=[f"{work}/.env"])
    d = decide(pol, Call("read_file", f"{work}/.env", (f"{work}/.env",)), P)
    assert (d.outcome, d.rule) == ("deny", "hidden-path")


def test_http_post_above_its_clearance_goes_to_policy(dirs: tuple[str, str]) -> None:
    call = Call("http_post", "127.0.0.1")
    assert decide(policy(dirs), call, N).outcome == "allow"  # internal ≤ default clearance
    asked = decide(policy(dirs), call, X)
    assert (asked.outcome, asked.ask_kind, asked.rule) == ("ask", "taint", "on_exceed=ask")
    assert decide(policy(dirs, on_exceed="deny"), call, X).rule == "on_exceed=deny"
    assert decide(policy(dirs, on_exceed="allow"), call, X).outcome == "allow"


def test_a_lower_configured_clearance_holds_even_internal_data(dirs: tuple[str, str]) -> None:
    pol = policy(dirs, clearance={"web_fetch": "public"})
    assert decide(pol, Call("web_fetch", "x.org"), N).outcome == "ask"


def test_an_allowlist_rule_covers_a_target_up_to_its_max_sensitivity(
    dirs: tuple[str, str],
) -> None:
    rules = [{"tool": "http_post", "target": "*.example.com", "max_sensitivity": "private"},
             {"tool": "http_post", "target": "hooks.corp", "max_sensitivity": "internal"}]
    pol = policy(dirs, allowlist=rules, clearance={"http_post": "public"})
    ok = decide(pol, Call("http_post", "api.example.com"), X)
    assert (ok.outcome, ok.rule) == ("allow", "allowlist#1")
    assert decide(pol, Call("http_post", "example.org"), X).outcome == "ask"
    assert decide(pol, Call("http_post", "hooks.corp"), N).rule == "allowlist#2"
    assert decide(pol, Call("http_post", "hooks.corp"), X).outcome == "ask"
    # A rule for one tool does not cover another.
    assert decide(pol, Call("http_get", "api.example.com"), X).outcome == "ask"


def test_evictions_recover_taint_and_the_gate_follows(dirs: tuple[str, str]) -> None:
    pol = policy(dirs)
    ledger = Ledger(3)
    ledger.add("read_file", "/secret", X)
    call = Call("http_post", "example.com")
    assert decide(pol, call, ledger.taint).outcome == "ask"
    for i in range(3):
        ledger.add("web_fetch", f"page{i}", P)
    assert ledger.taint is P
    assert decide(pol, call, ledger.taint).outcome == "allow"


def test_taint_tracking_disabled_lets_outbound_tools_run(dirs: tuple[str, str]) -> None:
    d = decide(policy(dirs, taint_enabled=False), Call("http_post", "x"), X)
    assert (d.outcome, d.rule) == ("allow", "taint-disabled")


def test_shell_is_outbound_only_with_a_network(dirs: tuple[str, str]) -> None:
    assert decide(policy(dirs, network=True), Call("shell", "curl x"), X).outcome == "ask"
    assert decide(policy(dirs, network=False), Call("shell", "curl x"), X).outcome == "allow"


def test_a_session_taint_approval_covers_only_that_target_and_level(
    dirs: tuple[str, str],
) -> None:
    pol = policy(dirs, clearance={"http_post": "public"})
    session = SessionApprovals(targets={("http_post", "a.org"): N})
    assert decide(pol, Call("http_post", "a.org"), N, session).rule == "session-approval"
    assert decide(pol, Call("http_post", "a.org"), X, session).outcome == "ask"
    assert decide(pol, Call("http_post", "b.org"), N, session).outcome == "ask"


def test_every_decision_carries_a_trace_of_its_steps(dirs: tuple[str, str]) -> None:
    d = decide(policy(dirs), Call("http_post", "x.org"), X)
    assert [s.check for s in d.steps] == ["permission", "read-path", "taint", "allowlist",
                                          "on_exceed"]
