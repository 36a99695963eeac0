"""Issue 50: an agent's CA (proxy/ca.py) signs for the names its credentials
cover and nothing else, says so in its own certificate (a name constraint,
no sub-CA), and keeps a bounded number of leaves."""

from __future__ import annotations

import pytest
from cryptography import x509

from leviathd.proxy import ca as ca_module
from leviathd.proxy.ca import AgentCA

HOSTS = ("api.example.com", "*.corp.test", "a?b.test", "10.0.0.1", "git.test:8443")


def test_the_names_are_the_covered_hosts_and_no_glob_or_address() -> None:
    assert AgentCA("0123abcd", HOSTS).names == ["api.example.com", "corp.test", "git.test"]


def test_only_a_covered_name_or_a_name_below_it_is_covered() -> None:
    ca = AgentCA("0123abcd", HOSTS)
    assert ca.covers("api.example.com") and ca.covers("x.corp.test") and ca.covers("corp.test")
    for host in ("xapi.example.com", "evilcorp.test", "example.com", "evil.test", "ab.test"):
        assert not ca.covers(host), host


@pytest.mark.parametrize("host", ["evil.test", "xapi.example.com", "example.com"])
def test_no_leaf_is_made_for_a_name_the_ca_does_not_cover(host: str) -> None:
    ca = AgentCA("0123abcd", HOSTS)
    with pytest.raises(ValueError, match="not a name this agent's CA signs for"):
        ca.leaf_context(host)


def test_the_cas_certificate_constrains_its_names_and_signs_no_sub_ca() -> None:
    cert = AgentCA("0123abcd", HOSTS).cert
    constraints = cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert constraints.critical
    permitted = [n.value for n in constraints.value.permitted_subtrees or []]
    assert permitted == ["api.example.com", "corp.test", "git.test"]
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert basic.ca and basic.path_length == 0


def test_a_ca_with_no_name_constrains_to_nothing_real() -> None:
    cert = AgentCA("0123abcd", ("10.0.0.1",)).cert
    constraints = cert.extensions.get_extension_for_class(x509.NameConstraints).value
    assert [n.value for n in constraints.permitted_subtrees or []] == ["invalid"]


def test_leaves_are_kept_within_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ca_module, "MAX_LEAVES", 3)
    ca = AgentCA("0123abcd", ("corp.test",))
    for i in range(6):
        ca.leaf_context(f"h{i}.corp.test")
    assert len(ca._leaves) <= 3
