"""Issue 44 item 3, from the agent's side of a real proxy: a covered host
(a stand-in TLS server) that says the request head back, in every form the
proxy wrote the secret (Basic's base64, Bearer, URL-encoded), chunked with a
chunk boundary at every offset of the secret, gzip- or deflate-compressed:
the agent never gets the secret. On the code before, the Basic echo, the
split chunk and the gzip answer gave the secret back (seen failing)."""

from __future__ import annotations

import asyncio
import base64
import gzip
import ssl
import zlib
from pathlib import Path
from urllib.parse import quote

import pytest
from test_proxy_inject import KEY, SECRET, Upstream, _through_proxy

from leviathd.proxy import inject

B64 = base64.b64encode(f"x-access-token:{SECRET}".encode())


class Echo(Upstream):
    """Answers with the request head it got, framed and coded as asked."""

    def __init__(self, tmp: Path, *, coding: str = "", cut: int | None = None) -> None:
        super().__init__(tmp)
        self.coding, self.cut = coding, cut

    async def serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head = await r.readuntil(b"\r\n\r\n")
            self.heads.append(head)
            said = head + b"url=" + quote(SECRET, safe="").encode() + b"\n"
            extra = b""
            if self.coding == "gzip":
                said, extra = gzip.compress(said), b"Content-Encoding: gzip\r\n"
            elif self.coding == "deflate":
                said, extra = zlib.compress(said), b"Content-Encoding: deflate\r\n"
            if self.cut is None:
                w.write(b"HTTP/1.1 200 OK\r\n" + extra + b"Content-Length: %d\r\n"
                        b"Connection: close\r\n\r\n" % len(said) + said)
            else:  # two chunks, split `cut` bytes into the secret
                at = said.index(SECRET.encode()) + self.cut
                w.write(b"HTTP/1.1 200 OK\r\n" + extra + b"Transfer-Encoding: chunked\r\n"
                        b"Connection: close\r\n\r\n" + b"%x\r\n" % at + said[:at] + b"\r\n"
                        + b"%x\r\n" % (len(said) - at) + said[at:] + b"\r\n0\r\n\r\n")
            await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            w.close()


def _check(got: bytes) -> None:
    assert got.startswith(b"HTTP/1.1 200 "), got
    head, _, rest = got.partition(b"\r\n\r\n")
    if b"chunked" in head.lower():
        plain, pos = b"", 0
        while True:
            end = rest.index(b"\r\n", pos)
            size = int(rest[pos:end], 16)
            if not size:
                break
            plain += rest[end + 2:end + 2 + size]
            pos = end + 4 + size
        rest = plain
    for form in (SECRET.encode(), B64, quote(SECRET, safe="").encode()):
        assert form not in got and form not in rest, (form, got)
    assert b"Accept-Encoding: identity" in rest, rest  # the request asked for plain bytes


REQ = b"GET /echo HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nAuthorization: PH\r\n\r\n"


@pytest.mark.parametrize("value", ["Bearer {secret}", "basic", "{secret}"])
def test_an_echo_of_the_head_never_gives_back_the_secret_in_any_form(
        tmp_path: Path, value: str) -> None:
    up = Echo(tmp_path)
    ph = inject.placeholder(KEY, "gh").encode()
    req = REQ.replace(b"Authorization: PH", b"Authorization: Basic " + base64.b64encode(
        b"x-access-token:" + ph) if value == "basic" else b"Authorization: PH")
    got = asyncio.run(_through_proxy(tmp_path, up, req, value=value))
    assert SECRET.encode() in up.heads[0] or B64 in up.heads[0]  # the host had it
    _check(got)
    scheme = value.split(" ")[0].encode() if " " in value else b""
    assert b"Authorization: " + scheme in got  # only the secret is masked, not its scheme


@pytest.mark.parametrize("cut", range(1, len(SECRET)))
def test_a_chunk_boundary_anywhere_in_the_secret_does_not_hide_it(tmp_path: Path,
                                                                   cut: int) -> None:
    got = asyncio.run(_through_proxy(tmp_path, Echo(tmp_path, cut=cut), REQ,
                                     value="Bearer {secret}"))
    _check(got)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_compressed_answer_is_inflated_and_masked(tmp_path: Path, coding: str) -> None:
    got = asyncio.run(_through_proxy(tmp_path, Echo(tmp_path, coding=coding), REQ,
                                     value="Bearer {secret}"))
    assert b"content-encoding" not in got.partition(b"\r\n\r\n")[0].lower()
    _check(got)
