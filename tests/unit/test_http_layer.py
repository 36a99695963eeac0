"""The one HTTP layer (issue 44, leviathd/http/): what it refuses, what it
writes, and a property test that whatever head an agent sends, what the
layer writes on holds only the grammar's bytes."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leviathd.http import body, message, target, write
from leviathd.http.grammar import BadMessage
from leviathd.proxy import inject

SMUGGLED = [
    # Bare LF ending a header and starting a second request.
    b"GET /a HTTP/1.1\r\nHost: api.test\r\nX-A: 1\n\nGET /collect HTTP/1.1\nHost: evil\r\n\r\n",
    b"GET /a HTTP/1.1\r\nHost: api.test\r\nX-A: 1\rHost: evil\r\n\r\n",  # bare CR
    b"GET /a HTTP/1.1\r\nHost: api.test\r\nX-A: a\0b\r\n\r\n",  # NUL
    b"GET /a\nHost:evil\n\nGET\t/b HTTP/1.1\r\nHost: api.test\r\n\r\n",  # LF in the target
    b"GET /a HTTP/1.1\r\nHost: api.test\r\nX-A: 1\r\n folded\r\n\r\n",  # obs-fold
    b"GET /a HTTP/1.1\r\nHost: api.test\r\nX-A: \x01\r\n\r\n",  # another control
    b"GET /a HTTP/1.1\r\nHost: api.test\r\nX A: 1\r\n\r\n",  # not a token
    b"GET /a#frag HTTP/1.1\r\nHost: api.test\r\n\r\n",
    b"GET /a%zz HTTP/1.1\r\nHost: api.test\r\n\r\n",
    b"GET /a HTTP/1.1\r\nHost: api.test\r\nHost: evil\r\n\r\n",  # two Hosts
    # Framing two parties could read differently.
    b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
    b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
    b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked"
    b"\r\n\r\n",
    b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n",
]


@pytest.mark.parametrize("raw", SMUGGLED)
def test_a_head_outside_the_grammar_or_framed_twice_is_refused(raw: bytes) -> None:
    with pytest.raises(inject.Refusal):
        inject.read_request(raw)


def test_the_target_is_sent_in_normal_origin_form() -> None:
    assert target.origin_form("/a/./b/../c%2fd?q=%7b\"x\"") == "/a/c%2Fd?q=%7B%22x%22"
    assert target.origin_form("/..") == "/"
    for bad in ("http://x/", "*", "/a b", "/a%2", "/a#b"):
        with pytest.raises(BadMessage):
            target.origin_form(bad)


def test_a_body_is_decoded_and_what_follows_is_kept_apart() -> None:
    _head, conn = message.parse_request(
        b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
    dec = body.Decoder(conn)
    data, done = dec.feed(b"4\r\nGET \r\n3\r\n/x \r\n0\r\n\r\nGET /second HTTP/1.1\r\n\r\n")
    assert (data, done) == (b"GET /x ", True)
    assert dec.rest == b"GET /second HTTP/1.1\r\n\r\n"
    enc = write.Encoder(message.Framing("chunked"))
    assert enc.data(data) + enc.end() == b"7\r\nGET /x \r\n0\r\n\r\n"


def test_the_writer_refuses_a_cr_lf_or_nul_from_anywhere() -> None:
    for name, value in (("X", "a\r\nB: c"), ("X", "a\0"), ("X\n", "a"), ("X", "a\nb")):
        with pytest.raises(BadMessage):
            write.request("GET", "/", [(name, value)])
    with pytest.raises(BadMessage):
        write.request("GET", "/a\r\nX: y", [])


# ------------------------------------------------ push: everything not a fetch

PH = "Basic eDpwaA=="


def _req(method: str, path: str, ctype: str = "") -> inject.Request:
    extra = f"\r\nContent-Type: {ctype}" if ctype else ""
    return inject.parse_head(f"{method} {path} HTTP/1.1\r\nHost: git.test{extra}".encode())


def test_only_gits_own_spelling_of_a_fetch_is_a_fetch() -> None:
    up = "application/x-git-upload-pack-request"
    assert _req("GET", "/r.git/info/refs?service=git-upload-pack").fetch
    assert _req("POST", "/r.git/git-upload-pack", up).fetch
    for req in (_req("GET", "/r.git/info/refs?service=git-receive-pack"),
                _req("POST", "/r.git/git-upload-pack"),  # no content type
                _req("POST", "/r.git/git-upload-p%61ck", up),
                _req("POST", "/r.git/git-upload-pack;x=1", up),
                _req("POST", "/r.git/git-upload-pack/", up),
                _req("POST", "/r.git/Git-Upload-Pack", up),
                _req("GET", "/r.git/info/refs?service=git-upload-pack&x=1"),
                _req("PUT", "/r.git/git-upload-pack", up),
                _req("GET", "/api/v3/user")):
        assert req.push, req


@pytest.mark.parametrize("path", [
    "/r.git/git-receive-pack", "/r.git/git-receive-p%61ck", "/r.git/git-receive-pack;p=1",
    "/r.git/git-receive-pack/", "/r.git/GIT-RECEIVE-PACK", "/r.git/git-receive-p%2561ck",
    "/r.git//git-receive-pack", "/r.git/x/../git-receive-pack",
])
def test_every_spelling_servers_route_to_receive_pack_is_read_as_a_push(path: str) -> None:
    req = _req("POST", path, "application/x-git-receive-pack-request")
    assert req.push and req.receive_pack, path


# --------------------------------------------------- the property: the grammar

_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+: (?:[\x21-\x7e\x80-\xff]"
                   rb"(?:[ \t]*[\x21-\x7e\x80-\xff])*)?\Z")
_REQUEST_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+ /[\x21-\x7e]* HTTP/1\.1\Z")

_pieces = st.sampled_from([b"\r\n", b"\n", b"\r", b"\0", b" ", b"\t", b":", b"Host",
                           b"X-A", b"a", b"\x7f", b"\x01", b"\xff", b"/", b"%", b"GET",
                           b"Transfer-Encoding", b"Content-Length", b"chunked", b"0"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_pieces, max_size=40), st.binary(max_size=30))
def test_random_heads_never_give_the_upstream_a_byte_outside_the_grammar(
        parts: list[bytes], noise: bytes) -> None:
    raw = (b"GET /p" + b"".join(parts) + b" HTTP/1.1\r\nHost: x\r\nX-B: "
           + b"".join(reversed(parts)) + noise + b"\r\n\r\n")
    try:
        req, _dec, _framing = inject.read_request(raw)
        head, _used = inject.rebuild(req, [], {}, host="api.test")
    except inject.Refusal:
        return
    assert head.endswith(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    assert _REQUEST_LINE.match(lines[0]), head
    for line in lines[1:]:
        assert _LINE.match(line), head


def test_the_engine_socket_reads_its_heads_through_the_layer() -> None:
    from leviathd.enginesock import wire
    for raw in (b"POST /v1.41/containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: 2\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n",
                b"GET /_ping HTTP/1.1\r\nHost: d\r\nX-A: 1\n\r\n"):
        with pytest.raises(wire.BadRequest):
            wire.parse_head(raw)
    head = wire.parse_head(b"GET /v1.41/x/../_ping?a=%7b HTTP/1.1\r\nHost: d\r\n\r\n")
    assert (head.target, head.path) == ("/v1.41/_ping?a=%7B", "/v1.41/_ping")


def test_a_push_is_shown_with_every_update_and_push_option_whole() -> None:
    from leviathd.proxy import receivepack, tls

    def pkt(text: str) -> bytes:
        return f"{len(text) + 4:04x}{text}".encode()
    old, new = "0" * 40, "1" * 40
    body = (pkt(f"{old} {new} refs/heads/b0\0report-status push-options")
            + b"".join(pkt(f"{old} {new} refs/heads/b{i}") for i in range(1, 200))
            + b"0000" + pkt("ci.skip") + pkt("merge_request.create") + b"0000PACK")
    updates, options, end = receivepack.parse_push(body)
    assert body[end:] == b"PACK" and options == ["ci.skip", "merge_request.create"]
    lines = tls.approval_lines(updates, options)
    assert lines[0] == "200 ref update(s), 2 push option(s)"
    assert [f"refs/heads/b{i}: create -> 111111111111" for i in range(200)] == lines[1:201]
    assert lines[201:] == ["push option 'ci.skip'", "push option 'merge_request.create'"]


def test_a_fetch_only_git_credential_goes_into_fetches_alone() -> None:
    fetch_only = inject.Injection(name="g", kind="git", hosts=("git.test",), placeholder="p",
                                  access=("fetch",))
    both = inject.Injection(name="h", kind="git", hosts=("git.test",), placeholder="q",
                            access=("fetch", "push"))
    up = "application/x-git-upload-pack-request"
    assert inject.applying([fetch_only, both], _req("POST", "/r.git/git-upload-pack", up)) == [
        fetch_only, both]
    for req in (_req("POST", "/r.git/git-receive-p%61ck"), _req("GET", "/r.git/HEAD"),
                _req("GET", "/r.git/info/refs?service=git-receive-pack"),
                _req("POST", "/r.git/git-upload-pack;x", up)):
        assert inject.applying([fetch_only, both], req) == [both], req


def test_the_engines_upgrade_and_streamed_answers_are_read() -> None:
    """docker run's attach is a 101 (h11 reads one only to a request that
    proposed an upgrade): read as a head, not refused (the CLI got EOF)."""
    from leviathd.enginesock import wire
    status, head = wire.response_head(b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/"
                                      b"vnd.docker.raw-stream\r\nConnection: Upgrade\r\n"
                                      b"Upgrade: tcp\r\n\r\n")
    assert status == 101 and head.get("upgrade") == "tcp"
    status, head = wire.response_head(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                      b"Transfer-Encoding: chunked\r\n\r\n")
    assert status == 200 and head.body_kind() == ("chunked", 0)
