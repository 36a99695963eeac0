"""Issue 48 §4: the unspecified addresses are judged as the host in
`call.ip` (leviathd/hosts.py); the agent's side is
tests/integration/test_rules_facts_bed.py."""

from __future__ import annotations

from leviathd.hosts import address_facts, canonical_host


def test_every_spelling_of_the_unspecified_address_is_loopback() -> None:
    for spelling in ("0.0.0.0", "0", "0x0", "[::]", "[::ffff:0.0.0.0]", "00.0"):
        host = canonical_host(spelling)
        assert host is not None, spelling
        facts = address_facts(host)
        assert facts["loopback"] and facts["unspecified"], (spelling, facts)
    assert not address_facts("192.0.2.1")["loopback"]
