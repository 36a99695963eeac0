"""network = "proxy": the merge (tighten-only), the policy's decisions, the
address checks, and the daemon-side server's limits on a real unix socket."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from pathlib import Path

import pytest
from test_merge import cfg, codes, run

from leviathd.broker.core import AuditRecord
from leviathd.config.merge import resolve
from leviathd.domain.sensitivity import Sensitivity
from leviathd.proxy import policy, service
from leviathd.proxy.policy import ProxySettings, decide
from leviathd.proxy.server import Agent, ProxyServer
from leviathd.sandbox.spec import SandboxSpec

# ---------------------------------------------------------------- the merge


def test_network_tightens_true_then_proxy_then_false() -> None:
    r = run('[sandbox]\nnetwork = "proxy"', "[sandbox]\nnetwork = true",
            stages='[stages.s]\ncommand = ["x"]\n[stages.s.sandbox]\nnetwork = false\n')
    assert r.agent.network == "proxy" and "network-overruled" in codes(r)
    assert r.stages["s"].network is False
    r = run("[sandbox]\nnetwork = false", user='[sandbox]\nnetwork = "proxy"')
    assert r.agent.network is False and "network-overruled" in codes(r)
    r = run("", '[sandbox]\nnetwork = "proxy"')
    assert r.agent.network == "proxy" and "network-overruled" not in codes(r)


def test_proxy_rules_only_narrow_over_the_layers() -> None:
    machine = ('[proxy]\nallow_domains = ["*.example.com"]\nports = [443, 80]\n'
               'max_connections = 10\n[proxy.clearance]\n"a.example.com" = "internal"\n')
    user = ('[proxy]\nallow_domains = ["a.example.com", "evil.test"]\nports = [443, 8080]\n'
            'deny_domains = ["b.example.com"]\nmax_connections = 99\n'
            '[proxy.clearance]\n"a.example.com" = "private"\n')
    r = resolve(cfg(machine), cfg(user), None, "a")
    s = policy.from_effective(r.agent, taint_enabled=True, on_exceed="deny",
                              shell_clearance=Sensitivity.INTERNAL, allow_private=False)
    assert s.ports == (443,) and s.max_connections == 10
    assert decide(s, "a.example.com", 443, Sensitivity.PUBLIC).outcome == "allow"
    # evil.test: the user allows it, the machine does not.
    assert decide(s, "evil.test", 443, Sensitivity.PUBLIC).rule == "not-allowed-domain"
    assert decide(s, "b.example.com", 443, Sensitivity.PUBLIC).rule == "deny-domain"
    assert decide(s, "a.example.com", 80, Sensitivity.PUBLIC).rule == "port"
    # The user's higher clearance does not raise the machine's.
    assert decide(s, "a.example.com", 443, Sensitivity.PRIVATE).outcome == "deny"


# ---------------------------------------------------------------- decisions


def test_wildcards_match_below_the_domain_only() -> None:
    assert policy.matches("*.example.com", "a.b.example.com")
    assert not policy.matches("*.example.com", "example.com")
    assert not policy.matches("*.example.com", "badexample.com")
    assert not policy.matches("example.com", "a.example.com")


def test_taint_above_a_domains_clearance_follows_on_exceed() -> None:
    s = ProxySettings(taint_enabled=True, on_exceed="ask",
                      clearance=(("docs.test", Sensitivity.PRIVATE),))
    assert decide(s, "other.test", 443, Sensitivity.INTERNAL).outcome == "allow"
    assert decide(s, "other.test", 443, Sensitivity.PRIVATE).outcome == "ask"
    assert decide(s, "docs.test", 443, Sensitivity.PRIVATE).outcome == "allow"
    deny = ProxySettings(taint_enabled=True, on_exceed="deny")
    assert decide(deny, "x.test", 443, Sensitivity.PRIVATE).rule == "taint-exceeds-clearance"
    off = ProxySettings(taint_enabled=False)
    assert decide(off, "x.test", 443, Sensitivity.PRIVATE).outcome == "allow"


@pytest.mark.parametrize("host", ["", "a..b", "a b", "x" * 300, "a/b", "\u00e4" * 70])
def test_names_that_are_no_host_are_refused(host: str) -> None:
    assert policy.normalize_host(host) is None


@pytest.mark.parametrize("spelling", ["127.0.0.1", "2130706433", "127.1", "0x7f000001",
                                      "0177.0.0.1", "[::ffff:127.0.0.1]", "::ffff:7f00:1",
                                      "127\u30020\u30020\u30021", "\uff11\uff12\uff17.0.0.1",
                                      "127.0.0.1."])
def test_every_spelling_of_loopback_meets_one_deny_pattern(spelling: str) -> None:
    """Issue 31: the proxy's deny_domains "127.0.0.1" holds for each spelling
    the resolver would read as it (fullwidth digits and ideographic dots
    were other strings before hosts.py: seen failing)."""
    host = policy.normalize_host(spelling)
    assert host == "127.0.0.1"
    s = ProxySettings(deny=("127.0.0.1", "localhost"))
    assert decide(s, host, 443, Sensitivity.PUBLIC).rule == "deny-domain"


@pytest.mark.parametrize("spelling", ["localhost", "LOCALHOST.", "\uff4cocalhost",
                                      "\uff2c\uff2f\uff23\uff21\uff2c\uff28\uff2f\uff33\uff34"])
def test_every_spelling_of_localhost_is_one_name(spelling: str) -> None:
    assert policy.normalize_host(spelling) == "localhost"


def test_international_names_are_compared_in_their_ascii_form() -> None:
    assert policy.normalize_host("ex\u00e4mple.com") == "xn--exmple-cua.com"
    assert policy.normalize_host("EX\u00c4MPLE.com") == "xn--exmple-cua.com"


def test_host_names_are_compared_normalized() -> None:
    assert policy.normalize_host("Example.COM.") == "example.com"
    assert policy.normalize_host("[::1]") == "::1"


@pytest.mark.parametrize("ip", ["127.0.0.1", "::1", "169.254.169.254", "fd00:ec2::254",
                                "169.254.1.1", "fe80::1", "0.0.0.0", "::ffff:127.0.0.1",
                                "224.0.0.1", "::127.0.0.1", "64:ff9b::7f00:1",
                                "::ffff:169.254.169.254"])
def test_loopback_link_local_and_metadata_are_refused_even_with_private_allowed(ip: str) -> None:
    assert policy.address_refusal(ipaddress.ip_address(ip), allow_private=True) is not None


def test_private_addresses_need_the_machines_flag() -> None:
    addr = ipaddress.ip_address("10.1.2.3")
    assert policy.address_refusal(addr, allow_private=False) is not None
    assert policy.address_refusal(addr, allow_private=True) is None
    assert policy.address_refusal(ipaddress.ip_address("93.184.216.34"),
                                  allow_private=False) is None
    # One refused answer refuses the name.
    assert policy.check_addresses(["93.184.216.34", "127.0.0.1"], allow_private=False)


def test_settings_survive_their_json() -> None:
    s = ProxySettings(allow=(("a.test", "*.b.test"),), deny=("c.test",), ports=(443,),
                      clearance=(("a.test", Sensitivity.PRIVATE),), max_connections=3,
                      taint_enabled=True, on_exceed="deny",
                      default_clearance=Sensitivity.PUBLIC, allow_private=True)
    assert ProxySettings.from_json(s.to_json()) == s


# ---------------------------------------------------------------- environment


def _spec(**kw: object) -> SandboxSpec:
    base: dict[str, object] = dict(
        kind="namespace", argv=("x",), env={"GIT_CONFIG_COUNT": "1",
                                            "GIT_CONFIG_KEY_0": "a.b", "GIT_CONFIG_VALUE_0": "c"},
        workdir="/w", workdir_mode="rw", uid=1, gid=1, groups=(), user="u", home="/h",
        sandbox_home="/h", mounts=(), hidden=(), namespaces=(), network=False, scratch="/s",
        hostname="h", execution_id="0123abcd", proxy=True)
    base.update(kw)
    return SandboxSpec(**base)  # type: ignore[arg-type]


def test_a_proxied_step_gets_the_proxy_variables_and_gits_setting() -> None:
    svc = service.ProxyService.__new__(service.ProxyService)
    env = svc.extend_spec(_spec()).env
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert env[name] == "http://127.0.0.1:3128"
    assert env["ALL_PROXY"] == "socks5h://127.0.0.1:3128"
    assert env["GIT_CONFIG_COUNT"] == "3" and env["GIT_CONFIG_KEY_0"] == "a.b"
    assert env["GIT_CONFIG_KEY_1"] == "http.proxy"
    assert env["GIT_CONFIG_KEY_2"] == "core.sshCommand"
    assert "lev connect %h %p" in env["GIT_CONFIG_VALUE_2"]
    assert "HTTP_PROXY" not in svc.extend_spec(_spec(proxy=False)).env
    # A container gets the same (the daemon starts its forwarder); unsandboxed
    # there is no proxy, and the spec says so.
    spec = svc.extend_spec(_spec(kind="container"))
    assert spec.proxy and spec.env["HTTP_PROXY"] == "http://127.0.0.1:3128"
    spec = svc.extend_spec(_spec(kind="none"))
    assert not spec.proxy and "HTTP_PROXY" not in spec.env and spec.notes


# ---------------------------------------------------------------- the server


def _server(tmp_path: Path, settings: ProxySettings, seen: list[AuditRecord]) -> ProxyServer:
    agent = Agent(id="0123abcd", user="u", uid=os.getuid(), gid=os.getgid(),
                  taint=lambda: Sensitivity.PUBLIC, approvals=lambda: None,
                  is_own=lambda _cg: True)
    return ProxyServer(agent, settings, str(tmp_path / "proxy.sock"), seen.append)


async def _exchange(path: str, data: bytes) -> bytes:
    r, w = await asyncio.open_unix_connection(path)
    try:
        w.write(data)
        return await asyncio.wait_for(r.read(), 5)
    except (ConnectionResetError, BrokenPipeError):
        return b""
    finally:
        w.close()


def test_the_connection_cap_holds_and_refusals_are_audited(tmp_path: Path) -> None:
    seen: list[AuditRecord] = []

    async def go() -> None:
        srv = _server(tmp_path, ProxySettings(max_connections=2), seen)
        await srv.start()
        path = str(tmp_path / "proxy.sock")
        held = [await asyncio.open_unix_connection(path) for _ in range(2)]
        for _r, w in held:
            w.write(b"C")  # a head begun, never finished
        await asyncio.sleep(0.1)
        assert b" 429 " in await _exchange(path, b"C")
        for _r, w in held:
            w.close()
        await asyncio.sleep(0.1)
        out = await _exchange(path, b"CONNECT example.com:25 HTTP/1.1\r\n\r\n")
        assert b" 403 " in out and b"port 25" in out
        out = await _exchange(path, b"CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n")
        assert b" 403 " in out and b"loopback" in out
        # SOCKS5 CONNECT to 169.254.169.254:80 (address type 1).
        out = await _exchange(path, b"\x05\x01\x00\x05\x01\x00\x01\xa9\xfe\xa9\xfe\x00\x50")
        assert out[:2] == b"\x05\x00" and out[2:4] == b"\x05\x02"
        # A name with control characters is recorded escaped.
        out = await _exchange(path, b"CONNECT \x1b[2Jbad:443 HTTP/1.1\r\n\r\n")
        assert b" 400 " in out
        # SOCKS5 BIND is not offered.
        out = await _exchange(path, b"\x05\x01\x00\x05\x02\x00\x01\x01\x01\x01\x01\x00\x50")
        assert out[2:4] == b"\x05\x07"
        # An oversized head is dropped without reading on.
        out = await _exchange(path, b"GET http://x/ HTTP/1.1\r\n" + b"X: y\r\n" * 5000)
        assert out == b""
        await srv.close()

    asyncio.run(go())
    outcomes = [(r.outcome, r.rule) for r in seen]
    assert ("deny", "max_connections") in outcomes
    assert ("deny", "address") in outcomes
    assert all(r.tool == "network" for r in seen)
    assert not any("\x1b" in r.target for r in seen)
    assert any("\\x1b" in r.target for r in seen)


def test_a_handed_over_tcp_connection_is_served_and_relayed_in_both_directions(
    tmp_path: Path,
) -> None:
    """The forwarder's way: NUL and the agent's TCP connection as a
    descriptor; the proxy then speaks on that connection itself, and the
    relay (splice) carries a large body both ways with its half-closes."""
    s = socket
    seen: list[AuditRecord] = []
    body = os.urandom(3 << 20)

    async def go() -> None:
        loop = asyncio.get_running_loop()
        upstream = s.create_server(("127.0.0.1", 0))
        upstream.setblocking(False)
        port = upstream.getsockname()[1]

        async def echo() -> None:
            c, _ = await loop.sock_accept(upstream)
            got = b""
            while data := await loop.sock_recv(c, 1 << 16):
                got += data
            await loop.sock_sendall(c, got[::-1])
            c.close()

        policy_check = policy.check_addresses
        policy.check_addresses = lambda *_a, **_k: None  # the upstream is on loopback
        try:
            srv = _server(tmp_path, ProxySettings(ports=(port,)), seen)
            await srv.start()
            task = asyncio.create_task(echo())
            lst = s.create_server(("127.0.0.1", 0))
            agent = s.create_connection(lst.getsockname())
            handed, _ = lst.accept()
            unix = s.socket(s.AF_UNIX)
            unix.connect(str(tmp_path / "proxy.sock"))
            s.send_fds(unix, [b"\0"], [handed.fileno()])
            unix.close()
            handed.close()
            agent.setblocking(False)
            await loop.sock_sendall(agent, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode()
                                    + body)
            agent.shutdown(s.SHUT_WR)
            got = b""
            while data := await asyncio.wait_for(loop.sock_recv(agent, 1 << 20), 10):
                got += data
            head, _, rest = got.partition(b"\r\n\r\n")
            assert b" 200 " in head and rest == body[::-1]
            await task
            agent.close()
            await asyncio.sleep(0.1)
            await srv.close()
        finally:
            policy.check_addresses = policy_check

    asyncio.run(go())
    done = [r for r in seen if r.outcome == "allow"]
    assert done and f"sent {len(body)} bytes, received {len(body)} bytes" in done[-1].detail


def test_a_handed_over_descriptor_that_is_not_tcp_is_dropped(tmp_path: Path) -> None:
    seen: list[AuditRecord] = []

    async def go() -> None:
        srv = _server(tmp_path, ProxySettings(), seen)
        await srv.start()
        r, w = os.pipe()
        unix = socket.socket(socket.AF_UNIX)
        unix.connect(str(tmp_path / "proxy.sock"))
        socket.send_fds(unix, [b"\0"], [w])
        unix.setblocking(False)
        loop = asyncio.get_running_loop()
        assert await asyncio.wait_for(loop.sock_recv(unix, 100), 5) == b""
        unix.close()
        os.close(r)
        os.close(w)
        await srv.close()

    asyncio.run(go())
    assert seen == []


def test_a_foreign_peer_is_dropped(tmp_path: Path) -> None:
    seen: list[AuditRecord] = []

    async def go() -> None:
        srv = _server(tmp_path, ProxySettings(), seen)
        srv.agent = Agent(id="x", user="u", uid=os.getuid(), gid=os.getgid(),
                          taint=lambda: Sensitivity.PUBLIC, approvals=lambda: None,
                          is_own=lambda _cg: False)
        await srv.start()
        out = await _exchange(str(tmp_path / "proxy.sock"),
                              b"CONNECT example.com:443 HTTP/1.1\r\n\r\n")
        assert out == b""
        await srv.close()

    asyncio.run(go())
    assert seen == []


def test_rules_missing_a_field_are_refused_not_read_as_no_rules() -> None:
    # Read with getattr fallbacks, rules without `allow` gave no allow list at
    # all: every domain passed.
    from types import SimpleNamespace

    bare = SimpleNamespace(proxy=SimpleNamespace(deny=(), ports=None, clearance=(),
                                                 max_connections=None))
    with pytest.raises(AttributeError, match="allow"):
        policy.from_effective(bare, taint_enabled=True, on_exceed="deny",  # type: ignore[arg-type]
                              shell_clearance=Sensitivity.INTERNAL, allow_private=False)


# ------------------------------------------- what mutation testing found open


def test_with_no_ports_configured_only_ssh_http_and_https_pass() -> None:
    s = policy.from_effective(resolve(cfg(""), None, None, "a").agent, taint_enabled=False,
                              on_exceed="ask", shell_clearance=None, allow_private=False)
    assert s.max_connections == 64  # docs/configuration.md
    for port in (22, 80, 443):
        assert decide(s, "a.test", port, Sensitivity.PUBLIC).outcome == "allow", port
    for port in (0, 21, 23, 25, 79, 81, 442, 444, 8080, 65535):
        assert decide(s, "a.test", port, Sensitivity.PUBLIC).rule == "port", port
    back = ProxySettings.from_json({k: v for k, v in s.to_json().items() if k != "ports"})
    assert back.ports == (22, 80, 443)


def test_settings_saved_without_a_default_clearance_read_back_as_internal() -> None:
    """A settings file of an adopted agent that lacks the field must not
    clear every domain for more than internal data."""
    s = ProxySettings(taint_enabled=True, on_exceed="deny")
    d = {k: v for k, v in s.to_json().items() if k != "default_clearance"}
    back = ProxySettings.from_json(d)
    assert back.default_clearance == Sensitivity.INTERNAL
    assert decide(back, "x.test", 443, Sensitivity.PRIVATE).outcome == "deny"
    assert not ProxySettings.from_json({}).allow_private


def test_a_host_name_of_253_characters_is_the_longest() -> None:
    longest = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])
    assert len(longest) == 253
    assert policy.normalize_host(longest) == longest
    assert policy.normalize_host(longest + ".") == longest  # the root's dot is no character
    too_long = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 62])
    assert len(too_long) == 254 and policy.normalize_host(too_long) is None
    assert policy.normalize_host(".") is None and policy.normalize_host("[]") is None
    assert policy.normalize_host("a" * 63 + ".test") is not None
    assert policy.normalize_host("a" * 64 + ".test") is None


@pytest.mark.parametrize("host", ["[a.test", "a.test]", "xa.test]", "[xa.test", "x[a.test]",
                                  "[a.test]x", "[a.test]"])
def test_brackets_are_only_around_an_address(host: str) -> None:
    got = policy.normalize_host(host)
    assert got is None or (got == "a.test" and host == "[a.test]")


def test_a_shell_cleared_lower_than_internal_lowers_every_domains_clearance() -> None:
    s = policy.from_effective(resolve(cfg(""), None, None, "a").agent, taint_enabled=True,
                              on_exceed="deny", shell_clearance=Sensitivity.PUBLIC,
                              allow_private=False)
    assert s.default_clearance == Sensitivity.PUBLIC
    assert decide(s, "a.test", 443, Sensitivity.INTERNAL).outcome == "deny"
    unset = policy.from_effective(resolve(cfg(""), None, None, "a").agent, taint_enabled=True,
                                  on_exceed="deny", shell_clearance=None, allow_private=False)
    assert unset.default_clearance == Sensitivity.INTERNAL
    assert decide(unset, "a.test", 443, Sensitivity.PRIVATE).outcome == "deny"


@pytest.mark.parametrize("form", ["93.184.216.34", "93.184.216.34.", "::ffff:93.184.216.34",
                                  "[::ffff:93.184.216.34]", "[::FFFF:5db8:d822]", "1572395042",
                                  "0x5db8d822", "0X5DB8D822", "93.184.55330", "93.12113954",
                                  "0135.184.216.34", "0x5d.0xb8.0xd8.0x22"])
def test_an_ip_literal_denied_is_denied_in_every_form_the_resolver_reads(form: str) -> None:
    """"IP literals are names too" (docs/configuration.md): the resolver
    (glibc's inet_aton) reads these as 93.184.216.34, and an IPv4-mapped
    IPv6 address is that IPv4 address."""
    s = ProxySettings(deny=("93.184.216.34",))
    host = policy.normalize_host(form)
    assert host == "93.184.216.34"
    denied = decide(s, host, 443, Sensitivity.PUBLIC)
    assert (denied.outcome, denied.rule) == ("deny", "deny-domain")
    assert decide(ProxySettings(allow=(("a.test",),)), host, 443,
                  Sensitivity.PUBLIC).outcome == "deny"
    allowed = ProxySettings(allow=(("93.184.216.34",),))
    assert decide(allowed, host, 443, Sensitivity.PUBLIC).outcome == "allow"


def test_names_that_only_start_like_numbers_stay_names() -> None:
    for name in ("1password.com", "0x.test", "123.example", "3com.com"):
        assert policy.normalize_host(name) == name
