"""web_fetch / http_get / http_post against an HTTP server this test runs on
127.0.0.1: loopback is refused by default and allowed by the config flag."""

from __future__ import annotations

import dataclasses
import http.server
import ipaddress
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from broker_harness import call, running_broker

from leviathd.broker import net
from leviathd.policy.settings import PolicySettings


class _Handler(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str, str, bytes]]] = []

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, body: bytes, status: int = 200, location: str | None = None) -> None:
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, self.headers.get("Host", ""), b""))
        if self.path == "/to-metadata":
            self._reply(b"", 302, "http://169.254.169.254/latest/meta-data/")
        elif self.path == "/hop":
            self._reply(b"", 302, "/page")
        else:
            self._reply(b"hello from loopback")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.seen.append(("POST", self.path, self.headers.get("Host", ""), body))
        self._reply(b"posted")


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.seen = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("addr", ["127.0.0.1", "::1", "10.1.2.3", "192.168.0.1", "172.16.0.1",
                                  "169.254.1.1", "fe80::1", "fd00::1", "100.64.0.1", "0.0.0.0",
                                  "::ffff:127.0.0.1", "224.0.0.1",
                                  # issue 21: IPv4 inside IPv6 (compatible, NAT64, 6to4)
                                  "::127.0.0.1", "64:ff9b::7f00:1", "64:ff9b::a00:1",
                                  "2002:7f00:1::1", "64:ff9b:1::7f00:1"])
def test_non_public_addresses_are_refused_by_default(addr: str) -> None:
    assert net.address_refusal(ipaddress.ip_address(addr), allow_private=False) is not None


@pytest.mark.parametrize("addr", ["169.254.169.254", "fd00:ec2::254", "::ffff:169.254.169.254",
                                  "::169.254.169.254", "64:ff9b::a9fe:a9fe"])
def test_metadata_addresses_are_refused_even_with_private_allowed(addr: str) -> None:
    assert net.address_refusal(ipaddress.ip_address(addr), allow_private=True) is not None


def test_public_addresses_pass() -> None:
    assert net.address_refusal(ipaddress.ip_address("93.184.216.34"), allow_private=False) is None
    # A NAT64 form of a public address is that public address.
    nat64 = ipaddress.ip_address("64:ff9b::5db8:d822")
    assert net.address_refusal(nat64, allow_private=False) is None


def _dirs(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "home" / "notes").mkdir(parents=True)
    (tmp_path / "home" / "notes" / "secret.txt").write_text("secret")
    (tmp_path / "work").mkdir()
    return str(tmp_path / "home"), str(tmp_path / "work")


def test_loopback_is_refused_by_default_and_nothing_is_sent(tmp_path: Path, server: str) -> None:
    home, work = _dirs(tmp_path)
    with running_broker(home=home, workdir=work, settings=PolicySettings(),
                        socket_path=str(tmp_path / "b.sock")) as b:
        for tool, args in (("http_get", {"url": server + "/x"}),
                           ("web_fetch", {"url": server + "/x"}),
                           ("http_post", {"url": server + "/x", "body": "data"})):
            reply = call(b.path, tool, args)
            assert reply["error"]["rule"] == "address-refused", reply
    assert _Handler.seen == []


def test_loopback_is_allowed_with_the_config_flag(tmp_path: Path, server: str) -> None:
    home, work = _dirs(tmp_path)
    settings = PolicySettings(allow_private_addresses=True)
    with running_broker(home=home, workdir=work, settings=settings,
                        socket_path=str(tmp_path / "b.sock")) as b:
        got = call(b.path, "http_get", {"url": server + "/x"})
        assert got["result"]["body"] == "hello from loopback"
        assert got["label"] == "public"
        posted = call(b.path, "http_post", {"url": server + "/in", "body": "payload"})
        assert posted["result"]["status"] == 200
    assert ("POST", "/in", server.removeprefix("http://"), b"payload") in _Handler.seen


def test_a_redirect_is_followed_on_the_same_host_only(server: str) -> None:
    assert net.request("GET", server + "/hop", allow_private=True).body == "hello from loopback"
    # Another host (here the metadata address) comes back to the agent, unfollowed.
    resp = net.request("GET", server + "/to-metadata", allow_private=True)
    assert resp.status == 302 and resp.headers["location"].startswith("http://169.254.169.254/")


def test_the_connection_goes_to_the_checked_address_not_a_fresh_lookup(server: str) -> None:
    # The name is never resolved again: the pinned connection reaches the
    # address it was given, and still sends the URL's host name.
    port = int(server.rsplit(":", 1)[1])
    conn = net._PinnedHTTP("rebind.invalid", port, "127.0.0.1", 5)
    conn.request("GET", "/pinned", headers={})
    assert conn.getresponse().status == 200
    conn.close()
    assert _Handler.seen[-1][1:3] == ("/pinned", f"rebind.invalid:{port}")


def test_read_then_post_is_held_then_allowlisted_then_free_after_evictions(
    tmp_path: Path, server: str
) -> None:
    home, work = _dirs(tmp_path)
    secret = str(Path(home) / "notes" / "secret.txt")
    base = PolicySettings(read_paths=["~/notes"], allow_private_addresses=True,
                          approval_timeout=0.2, budget=3)
    post = {"url": server + "/out", "body": "hi"}
    with running_broker(home=home, workdir=work, settings=base,
                        socket_path=str(tmp_path / "b.sock")) as b:
        assert call(b.path, "read_file", {"path": secret})["taint"] == "private"
        held = call(b.path, "http_post", post)
        assert not held["ok"] and held["error"]["rule"].startswith("on_exceed=ask")
        assert b.asked and b.asked[-1].tool == "http_post"
        assert not any(s[0] == "POST" for s in _Handler.seen)

        rule = {"tool": "http_post", "target": "127.0.0.1", "max_sensitivity": "private"}
        b.run(lambda: b.broker.reload(dataclasses.replace(base, allowlist=[rule])))
        assert call(b.path, "http_post", post)["ok"]

        b.run(lambda: b.broker.reload(base))
        asked = len(b.asked)
        (Path(work) / "code.py").write_text("x = 1\n")
        for _ in range(3):
            reply = call(b.path, "read_file", {"path": "code.py"})
            assert reply["label"] == "internal"
        assert reply["taint"] == "internal"
        reply = call(b.path, "http_post", post)
        assert reply["ok"], reply
        assert len(b.asked) == asked  # not asked: the Private entries were evicted
