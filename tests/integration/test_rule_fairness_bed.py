"""Issue 31 §4 in the bed: while alice's agent floods read_file calls under
her largest rule set (256 rules in her config, 256 in her blueprint, each
just under its own step budget), bob's `lev ps` is served, and alice's
calls are refused by the call's step budget (named in the audit) rather
than each running all 512 rules. Before the call budget and the lanes, her
calls ran about half a second each on the daemon's loop and bob's `lev ps`
took seconds (issue 31; bench/rule_fairness.py prints the ratio)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rule_flood import Flood, lay_out_flood, restore
from test_gate_bed import audit
from testbed import Testbed

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    old_machine = testbed.run(["cat", "/etc/leviath/config.toml"], check=False).stdout
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    old = lay_out_flood(testbed)
    testbed.run(["systemctl", "restart", "leviathd"])
    yield testbed
    restore(testbed, old)
    testbed.write_file("/etc/leviath/config.toml", old_machine)
    testbed.run(["systemctl", "restart", "leviathd"])


def test_bob_is_served_while_alices_agent_floods_calls_under_her_largest_rule_set(
    bed: Testbed,
) -> None:
    with Flood(bed) as flood:
        for _ in range(3):
            r = bed.run(["lev", "ps"], user="bob", check=False, timeout=60)
            assert r.returncode == 0, r.stderr
    assert flood.count > 0
    records = [r for r in audit(bed, flood.agent) if r.get("LEVIATH_TOOL") == "read_file"]
    assert records, "no audit record of alice's calls"
    assert any("step budget" in r.get("LEVIATH_DETAIL", "") for r in records), records[:3]
