"""leviathd.audit.trail.AuditWriter: per-agent budgets, summaries that account for
every held call, and the trusted journal matches."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from leviathd.audit.trail import AuditWriter, trusted_matches
from leviathd.broker.core import AuditRecord


def rec(agent: str, tool: str = "web_fetch", outcome: str = "deny") -> AuditRecord:
    return AuditRecord(agent=agent, user="u", uid=1000, tool=tool, target="t", taint="public",
                       clearance="-", rule="r", outcome=outcome)


def test_a_flooding_agent_is_summarised_and_another_keeps_its_records() -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    w = AuditWriter(send=lambda msg, **f: sent.append((msg, f)), agent_burst=5,
                    agent_rate=0.0, total_burst=100, total_rate=0.0)
    for _ in range(1000):
        w.tool(rec("a"))
    for _ in range(3):
        w.tool(rec("b", "read_file", "allow"), taint_after="internal")
    w.finish("a")
    w.finish("b")
    single_a = [f for _, f in sent if f.get("LEVIATH_AGENT") == "a" and
                f["LEVIATH_EVENT"] == "tool"]
    summary = [(m, f) for m, f in sent if f["LEVIATH_EVENT"] == "tool-summary"]
    assert len(single_a) == 5
    assert len(summary) == 1 and summary[0][1]["LEVIATH_COUNT"] == 995
    assert "995 refused calls to web_fetch" in summary[0][0]
    b = [f for _, f in sent if f.get("LEVIATH_AGENT") == "b"]
    assert len(b) == 3 and all(f["LEVIATH_TAINT_AFTER"] == "internal" for f in b)


def test_new_tool_names_share_one_summary_bucket_past_the_cap() -> None:
    sent: list[dict[str, Any]] = []
    w = AuditWriter(send=lambda msg, **f: sent.append(f), agent_burst=0, agent_rate=0.0)
    for i in range(100):
        w.tool(rec("a", f"tool{i}"))
    w.finish("a")
    (summary,) = sent
    assert summary["LEVIATH_COUNT"] == 100
    assert summary["LEVIATH_SUMMARY"].count(";") == 8  # 8 names and "(other tools)"


def test_trusted_matches_name_only_journald_stamped_fields_and_the_agent() -> None:
    m = trusted_matches("abc", "leviath-x-y-abc.scope", unit="leviathd.service")
    assert "_UID=0" in m and "_TRANSPORT=journal" in m
    assert {"_SYSTEMD_UNIT=leviathd.service", "_SYSTEMD_UNIT=leviath-x-y-abc.scope"} <= set(m)
    assert not any(x.startswith(("SYSLOG_IDENTIFIER", "_PID")) for x in m)


def test_refused_calls_do_not_push_an_allowed_call_into_a_summary() -> None:
    """A hostile agent's cheap refused calls must not hide the target of a
    call it was allowed to make (tests/integration/test_redteam_audit.py)."""
    sent: list[dict[str, Any]] = []
    w = AuditWriter(send=lambda msg, **f: sent.append(f), agent_burst=5, agent_rate=0.0)
    for _ in range(100):
        w.tool(rec("a"))
    w.tool(rec("a", "http_get", "allow"))
    w.finish("a")
    allowed = [f for f in sent if f["LEVIATH_EVENT"] == "tool" and f["LEVIATH_OUTCOME"] == "allow"]
    assert len(allowed) == 1 and allowed[0]["LEVIATH_TOOL"] == "http_get"


def test_a_burst_of_allowed_calls_keeps_the_targets_it_touched() -> None:
    """An agent that makes hundreds of allowed calls at once (a write_file to
    every file of a tree) must not make its writes anonymous: the summary
    names the distinct targets, up to a bound, and says how many it left out."""
    sent: list[tuple[str, dict[str, Any]]] = []
    w = AuditWriter(send=lambda msg, **f: sent.append((msg, f)), agent_burst=2, agent_rate=0.0)
    for i in range(300):
        w.tool(replace(rec("a", "write_file", "allow"), target=f"/work/f{i % 50}"))
    w.finish("a")
    summary = [(m, f) for m, f in sent if f["LEVIATH_EVENT"] == "tool-summary"]
    assert len(summary) == 1
    msg, fields = summary[0]
    targets = fields["LEVIATH_TARGETS"].split("\n")
    # f0 and f1 went out one by one; the summary lists the next distinct ones.
    assert targets[:3] == ["/work/f2", "/work/f3", "/work/f4"]
    assert len(targets) == 32 and "/work/f49" not in targets
    # f34..f49 (96 calls) and the later f0, f1 (10) are counted, not listed.
    assert "and 106 more calls to targets not listed" in msg


def test_summary_targets_are_bounded_in_size_whatever_the_agent_names() -> None:
    sent: list[dict[str, Any]] = []
    w = AuditWriter(send=lambda msg, **f: sent.append(f), agent_burst=0, agent_rate=0.0)
    for i in range(1000):
        w.tool(replace(rec("a", "write_file", "allow"), target=f"/{i}/" + "x" * 10_000))
    w.finish("a")
    (summary,) = sent
    assert len(summary["LEVIATH_TARGETS"]) <= 32 * 260


def test_a_huge_target_is_written_cut_with_its_length_and_short_ones_whole() -> None:
    """Issue 31: the journal write is synchronous, so a 48,000-character path
    made each record ~100 KB and another user's `List` wait (bench: 139 ms
    median against 28 ms once cut). The record says it is cut and how long
    the target was (it was whole: seen failing)."""
    from leviathd.audit.trail import RECORD_TARGET_MAX

    sent: list[tuple[str, dict[str, Any]]] = []
    w = AuditWriter(send=lambda msg, **f: sent.append((msg, f)))
    big = "/w/" + "a" * 48_000
    w.tool(replace(rec("a"), target=big))
    w.tool(replace(rec("a"), target="/w/small.txt"))
    (m1, f1), (_m2, f2) = sent
    assert len(f1["LEVIATH_TARGET"]) < RECORD_TARGET_MAX + 64 and len(m1) < RECORD_TARGET_MAX + 300
    assert f1["LEVIATH_TARGET"].startswith(big[:100])
    assert "cut: 48003 characters" in f1["LEVIATH_TARGET"]
    assert f1["LEVIATH_TARGET_LENGTH"] == "48003"
    assert f2["LEVIATH_TARGET"] == "/w/small.txt" and "LEVIATH_TARGET_LENGTH" not in f2
