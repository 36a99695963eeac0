"""Issue 30, item 0: `network = "proxy"` is the built-in default of a fenced
agent; `true` an explicit choice; `[proxy] host_ports` and `private_ranges`
open what the proxy otherwise refuses, by the configs only; the refusals
name the setting that would open them."""

from __future__ import annotations

import ipaddress

import pytest
from test_merge import cfg, codes, run

from leviathd.config.merge import resolve
from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import ConfigError
from leviathd.proxy import policy
from leviathd.proxy.policy import ProxySettings, decide


def settings(machine: str = "", blueprint: str = "", user: str | None = None) -> ProxySettings:
    r = run(machine, blueprint, user)
    return policy.from_effective(r.agent, taint_enabled=False, on_exceed="ask",
                                 shell_clearance=None, allow_private=False)


def test_with_no_config_a_fenced_agent_is_behind_the_proxy() -> None:
    assert run().agent.network == "proxy"
    assert run("", '[sandbox]\nkind = "container"').agent.network == "proxy"
    assert resolve(cfg(""), None, None, "a").agent.network == "proxy"


def test_kind_none_keeps_the_host_network_by_default_it_has_no_proxy() -> None:
    assert run('[sandbox]\nkind = "none"').agent.network is True
    # A blueprint that raises the kind gets the proxy again.
    assert run('[sandbox]\nkind = "none"', '[sandbox]\nkind = "namespace"').agent.network == "proxy"


def test_true_is_an_explicit_choice_of_a_config_never_of_a_blueprint() -> None:
    assert run("[sandbox]\nnetwork = true").agent.network is True
    # The machine left it open: the user may choose the host's network.
    r = run("", user="[sandbox]\nnetwork = true")
    assert r.agent.network is True and "network-overruled" not in codes(r)
    # A blueprint alone may not: the default is the proxy.
    r = run("", "[sandbox]\nnetwork = true")
    assert r.agent.network == "proxy" and "network-overruled" in codes(r)
    msg = next(f.message for f in r.findings if f.code == "network-overruled")
    assert 'built-in default is network = "proxy"' in msg
    # The machine's "proxy" is a ceiling for the user.
    r = run('[sandbox]\nnetwork = "proxy"', user="[sandbox]\nnetwork = true")
    assert r.agent.network == "proxy" and "network-overruled" in codes(r)


def test_host_ports_are_opened_by_configs_and_only_narrowed_by_blueprints() -> None:
    assert settings("[proxy]\nhost_ports = [3000, 5432]").host_ports == (3000, 5432)
    # The user opens her own where the machine set no network.
    assert settings("[proxy]\nhost_ports = [5432]", user="[proxy]\nhost_ports = [3000]"
                    ).host_ports == (3000, 5432)
    # Where the machine chose the proxy, the user's list only narrows.
    r = run('[sandbox]\nnetwork = "proxy"\n[proxy]\nhost_ports = [5432]', "",
            user="[proxy]\nhost_ports = [3000]")
    assert r.agent.proxy.host_ports == () and "proxy-opening-overruled" in codes(r)
    # A blueprint never opens one.
    r = run("[proxy]\nhost_ports = [3000]", "[proxy]\nhost_ports = [3000, 22]")
    assert r.agent.proxy.host_ports == (3000,) and "proxy-opening-overruled" in codes(r)
    r = run("", '[proxy]\nprivate_ranges = ["10.0.0.0/8"]')
    assert r.agent.proxy.private_ranges == ()


@pytest.mark.parametrize("bad", ["127.0.0.0/8", "169.254.0.0/16", "8.8.8.0/24", "0.0.0.0/0",
                                 "::1/128", "nonsense"])
def test_private_ranges_are_private_lan_ranges_only(bad: str) -> None:
    with pytest.raises(ConfigError):
        cfg(f'[proxy]\nprivate_ranges = ["{bad}"]')


def test_a_host_loopback_port_is_refused_naming_host_ports_unless_opened() -> None:
    s = ProxySettings()
    for host in ("localhost", "127.0.0.1", "127.1.2.3", "::1", "host.leviath.internal"):
        d = decide(s, host, 3000, Sensitivity.PUBLIC)
        assert d.outcome == "deny" and "[proxy] host_ports = [3000]" in d.reason
    opened = ProxySettings(host_ports=(3000,))
    assert decide(opened, "localhost", 3000, Sensitivity.PUBLIC).outcome == "allow"
    assert decide(opened, "localhost", 3001, Sensitivity.PUBLIC).outcome == "deny"
    assert policy.host_loopback("host.leviath.internal") == "127.0.0.1"
    # A name that resolves to loopback does not name the host: refused at
    # the address check, which says how the host is reached.
    assert policy.host_loopback("loop.test") is None
    why = policy.check_addresses(["127.0.0.1"], allow_private=True)
    assert why is not None and "host_ports" in why
    # An opened host port is not a port to every other host.
    assert decide(opened, "example.com", 3000, Sensitivity.PUBLIC).rule == "port"


def test_private_ranges_open_those_addresses_only_and_the_refusal_names_the_setting() -> None:
    why = policy.check_addresses(["192.168.1.7"], allow_private=False)
    assert why is not None and '[proxy] private_ranges = ["192.168.1.7/32"]' in why
    assert policy.check_addresses(["192.168.1.7"], allow_private=False,
                                  private_ranges=("192.168.1.0/24",)) is None
    assert policy.check_addresses(["::ffff:192.168.1.7"], allow_private=False,
                                  private_ranges=("192.168.1.0/24",)) is None
    assert policy.check_addresses(["192.168.2.7"], allow_private=False,
                                  private_ranges=("192.168.1.0/24",)) is not None
    # Never loopback, link-local or metadata, whatever is listed.
    for ip in ("127.0.0.1", "169.254.169.254"):
        assert policy.check_addresses([ip], allow_private=False,
                                      private_ranges=("10.0.0.0/8",)) is not None
    assert ipaddress.ip_network("10.0.0.0/8")


def test_the_openings_survive_a_daemon_restart() -> None:
    s = ProxySettings(host_ports=(3000,), private_ranges=("10.0.0.0/8",))
    assert ProxySettings.from_json(s.to_json()) == s
