"""A CONNECT to a host one of the agent's credentials covers (issue 30): the
proxy is the TLS server toward the agent (a leaf from the agent's own CA,
proxy/ca.py) and a TLS client toward the real host, verifying the host's
certificate against the system's CAs before any secret is sent. One request
per connection: its head is parsed and written anew by the one HTTP layer
(leviathd/http/, proxy/inject.py), with the secret where the placeholder
was; toward a git credential's host anything not proven a fetch is a push,
first approved by a person who sees every ref update and push option it
asks for (proxy/receivepack.py). The body is decoded and framed anew, and
nothing after it is sent; the answer is copied back, masked. If the host does not
verify, the agent gets a 502 saying why and nothing was sent upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import zlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from leviathd.errors import LeviathError
from leviathd.http import body, message, write
from leviathd.http.grammar import BadMessage
from leviathd.http.message import Framing
from leviathd.proxy import inject, mask, receivepack

if TYPE_CHECKING:
    from leviathd.proxy.ca import AgentCA  # loaded lazily (proxy/server.py)

MAX_HEAD = 16384
TIMEOUT = 30.0
COPY = 1 << 16


@dataclass
class Outcome:
    """What the audit record says of one intercepted connection."""

    method: str = "-"
    path: str = "-"
    used: list[str] = field(default_factory=list)
    refs: list[str] = field(default_factory=list)
    refused: str = ""
    sent: int = 0
    received: int = 0
    answered: bool = False  # by the daemon itself (LocalAnswer): nothing went upstream


# Answers a push: True to let it through. Arguments: the repository URL and
# the ref updates in words.
AskPush = Callable[[str, list[str]], Awaitable[bool]]
ReadSecret = Callable[[str], Awaitable[str]]
# A request the daemon answers itself (proxy/azure.py: the agent's sign-in):
# (host, port, the request, the agent's stream for its body) -> (the answer,
# the credential it stood for), or None to go on upstream.
LocalAnswer = Callable[[str, int, inject.Request, asyncio.StreamReader],
                       Awaitable[tuple[bytes, str] | None]]


def client_context() -> ssl.SSLContext:
    """Toward the real host: the system's CAs, the host name checked."""
    ctx = ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


async def _answer(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    text = f"leviathd proxy: {message}\n".encode("utf-8", "replace")[:2000]
    with contextlib.suppress(ConnectionError, OSError, RuntimeError):
        writer.write(write.answer(status, "Refused", "text/plain", text))
        await writer.drain()


async def _read_body(reader: asyncio.StreamReader, decoder: body.Decoder, got: bytearray,
                     want: Callable[[bytes], bool], bound: int) -> bool:
    """Reads and decodes the body into `got` until `want(got)` or its end
    (False when it ended before), refused past `bound` bytes."""
    while not want(bytes(got)):
        if decoder.done:
            return False
        if len(got) > bound:
            raise inject.Refusal(413, "the body is too long to be read here")
        more = await reader.read(COPY)
        data, _ = decoder.feed(more) if more else decoder.end()
        if not more and not decoder.done:
            raise inject.Refusal(400, "the request ends before its body does")
        got += data
    return True


async def _push_commands(reader: asyncio.StreamReader, req: inject.Request,
                         decoder: body.Decoder, got: bytearray
                         ) -> tuple[list[receivepack.RefUpdate], list[str]]:
    """Read the decoded body until its commands and push options end."""
    if (req.header("content-encoding") or "identity").lower() != "identity":
        raise inject.Refusal(415, "a compressed push body is not read")
    found: list[tuple[list[receivepack.RefUpdate], list[str]]] = []

    def whole(data: bytes) -> bool:
        try:
            updates, options, _ = receivepack.parse_push(data)
        except receivepack.Incomplete:
            return False
        except ValueError as exc:
            raise inject.Refusal(400, f"not a git push: {exc}") from None
        found.append((updates, options))
        return True

    if not await _read_body(reader, decoder, got, whole, receivepack.MAX_COMMANDS):
        raise inject.Refusal(400, "the push ends before its ref updates do")
    return found[-1]


def approval_lines(updates: Sequence[receivepack.RefUpdate], options: Sequence[str]
                   ) -> list[str]:
    """What a person approves: every update and every push option, whole."""
    return ([f"{len(updates)} ref update(s), {len(options)} push option(s)"]
            + [u.text() for u in updates] + [f"push option {o!r}" for o in options])


# An answer compressed although `identity` was asked for: inflated here
# (bounded) so that the mask reads the plain bytes.
_INFLATE = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS,
            "deflate": zlib.MAX_WBITS}
MAX_INFLATE = 1 << 30
_HOP = ("connection", "keep-alive", "proxy-connection")


def _inflated(d: Any, data: bytes, total: list[int]) -> Iterator[bytes]:
    """`data` inflated by `d` (a zlib decompressobj), COPY bytes at a time:
    a small answer that inflates to much never sits whole in memory."""
    out = d.decompress(data, COPY)
    while True:
        total[0] += len(out)
        if total[0] > MAX_INFLATE:
            raise BadMessage(f"the answer inflates to over {MAX_INFLATE} bytes")
        yield out
        if not d.unconsumed_tail:
            return
        out = d.decompress(d.unconsumed_tail, COPY)


async def _back(src: asyncio.StreamReader, dst: asyncio.StreamWriter, method: str,
                hide: mask.Mask, count: list[int]) -> None:
    """The covered host's answer read by the one HTTP layer: its head
    written anew, its body decoded (and inflated), masked and framed anew,
    so that neither a chunk boundary nor a compression hides a secret."""
    written = False
    try:
        while True:
            raw = await src.readuntil(b"\r\n\r\n")
            count[1] += len(raw)
            head, conn = message.parse_response(raw, method)
            if head.status == 101:
                dst.write(write.response(head.status, head.reason, head.headers))
                await _copy(src, dst, count, 1, hide)
                return
            if head.status >= 200:
                break
            dst.write(write.response(head.status, head.reason, head.headers))  # 1xx
        coding = (head.get("content-encoding") or "identity").strip().lower()
        if coding != "identity" and coding not in _INFLATE:
            raise BadMessage(f"an answer in content coding {coding[:40]!r}, which the proxy "
                             "cannot read to mask the secret")
        bodiless = method == "HEAD" or head.status in (204, 304)
        kept = [(k, v) for k, v in head.headers if k.lower() not in _HOP]
        framing = head.framing()
        inflate = None
        if coding in _INFLATE and not bodiless:
            inflate = zlib.decompressobj(_INFLATE[coding])
            kept = [(k, v) for k, v in kept if k.lower() not in
                    ("content-encoding", "content-length", "transfer-encoding")]
            kept.append(("Transfer-Encoding", "chunked"))
            framing = Framing("chunked")
        encoder = write.Encoder(Framing("none") if bodiless else framing)
        dst.write(write.response(head.status, head.reason, [*kept, ("Connection", "close")]))
        written = True
        decoder = body.Decoder(conn)
        total = [0]
        _, done = decoder.feed(b"")  # a body of none or 0 bytes ends at its head
        while not done:
            data = await src.read(COPY)
            count[1] += len(data)
            part, done = decoder.feed(data) if data else decoder.end()
            pieces = _inflated(inflate, part, total) if inflate and part else [part]
            dst.write(b"".join(encoder.data(hide.feed(p)) for p in pieces))
            if not data and not done:
                return  # cut short: the agent sees the answer end early
            await dst.drain()
        dst.write(encoder.data(hide.flush()) + encoder.end())
        await dst.drain()
    except BadMessage as exc:
        if not written:
            await _answer(dst, 502, f"the answer of the covered host was refused: {exc}")
    except (ConnectionError, OSError, ssl.SSLError, asyncio.IncompleteReadError,
            asyncio.LimitOverrunError, zlib.error):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError, RuntimeError, ssl.SSLError):
            if dst.can_write_eof():
                dst.write_eof()


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: list[int],
                i: int, hide: mask.Mask | None = None) -> None:
    try:
        while data := await src.read(COPY):
            count[i] += len(data)
            dst.write(hide.feed(data) if hide else data)
            await dst.drain()
        if hide:
            dst.write(hide.flush())
    except (ConnectionError, OSError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError, RuntimeError, ssl.SSLError):
            if dst.can_write_eof():
                dst.write_eof()


async def _copy_body(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                     decoder: body.Decoder, encoder: write.Encoder, count: list[int]) -> None:
    """The rest of the request's body, decoded and framed anew, and not a byte
    past it (what follows on the connection is never sent)."""
    try:
        while True:
            data = await src.read(COPY)
            part, done = decoder.feed(data) if data else decoder.end()
            out = encoder.data(part) + (encoder.end() if done else b"")
            dst.write(out)
            count[0] += len(part)
            await dst.drain()
            if done or not data:
                return
    except (ConnectionError, OSError, ssl.SSLError, BadMessage):
        pass


async def _accept_tls(agent: socket.socket, leaf: ssl.SSLContext
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The agent's connection as the TLS server's side (StreamWriter.start_tls
    would be the client's)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_HEAD, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await asyncio.wait_for(loop.connect_accepted_socket(
        lambda: protocol, sock=agent, ssl=leaf, ssl_handshake_timeout=TIMEOUT), TIMEOUT)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def intercept(
    agent: socket.socket, up: socket.socket,
    *, host: str, port: int, ca: AgentCA, injections: Sequence[inject.Injection],
    secret: ReadSecret, ask_push: AskPush, upstream: ssl.SSLContext,
    local: LocalAnswer | None = None,
) -> Outcome:
    """Serve one intercepted CONNECT (the 200 already sent) on the agent's
    socket (this takes it). `up` is the connected TCP socket to the checked
    address; it is closed by the caller."""
    out = Outcome()
    try:
        leaf = await asyncio.to_thread(ca.leaf_context, host)
        reader, writer = await _accept_tls(agent, leaf)
    except (ssl.SSLError, OSError, TimeoutError, ValueError) as exc:
        agent.close()
        out.refused = f"no TLS with the agent: {exc}"
        return out
    except BaseException:
        agent.close()
        raise
    try:
        return await _serve(reader, writer, up, out, host=host, port=port,
                            injections=injections, secret=secret, ask_push=ask_push,
                            upstream=upstream, local=local)
    finally:
        writer.close()


async def _serve(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: socket.socket,
    out: Outcome, *, host: str, port: int, injections: Sequence[inject.Injection],
    secret: ReadSecret, ask_push: AskPush, upstream: ssl.SSLContext,
    local: LocalAnswer | None = None,
) -> Outcome:
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        out.refused = "no request head"
        return out
    got = bytearray()  # the body decoded so far (a push's commands)
    try:
        req, decoder, framing = inject.read_request(raw)
        out.method, out.path = req.method, req.path[:300]
        answered = await local(host, port, req, reader) if local is not None else None
        if answered is not None:
            out.used, out.answered = [answered[1]], True
            writer.write(answered[0])
            await writer.drain()
            out.received = len(answered[0])
            return out
        # An intercept-only entry (the azure authority's) never gets a secret;
        # toward a git credential's host anything not proven a fetch is a push.
        applies = inject.applying(injections, req)
        gated = [i for i in applies if i.kind == "git" and not req.fetch]
        if req.receive_pack or (gated and not req.push_discovery):
            where = f"https://{host}{'' if port == 443 else f':{port}'}"
            if req.receive_pack:
                updates, options = await asyncio.wait_for(
                    _push_commands(reader, req, decoder, got), TIMEOUT)
                out.refs = approval_lines(updates, options)
                what = out.refs
                repo = where + req.path.partition("?")[0].rsplit("/", 1)[0]
            else:
                what = [f"{req.method} {req.path} (not a git fetch)"]
                repo = where + req.path
            if not await ask_push(repo, what):
                raise inject.Refusal(403, "the push was refused by a person (or the wait "
                                          "timed out); nothing was sent")
        secrets: dict[str, str] = {}
        for inj in applies:
            if inj.kind == "login" and not inject.carried(req, inj):
                continue  # not put in (inject.rebuild): not read, nor needed now
            try:
                secrets[inj.name] = inject.check_secret(await secret(inj.name))
            except (OSError, ValueError, LookupError, LeviathError) as exc:
                raise inject.Refusal(502, f"credential {inj.name!r} is unavailable: "
                                          f"{str(exc)[:200]}") from None
        where = host if port == 443 else f"{host}:{port}"
        head, out.used = inject.rebuild(req, applies, secrets, host=where)
    except inject.Refusal as exc:
        out.refused = str(exc)
        await _answer(writer, exc.status, str(exc))
        return out
    try:
        up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(
            sock=up, ssl=upstream, server_hostname=host, limit=COPY), TIMEOUT)
    except ssl.SSLCertVerificationError as exc:
        out.used, out.refused = [], f"{host}'s certificate does not verify: {exc.verify_message}"
        await _answer(writer, 502, f"{out.refused}; no credential was sent")
        return out
    except (ssl.SSLError, OSError, TimeoutError) as exc:
        out.used, out.refused = [], f"no TLS connection to {host}: {exc}"
        await _answer(writer, 502, f"{out.refused}; no credential was sent")
        return out
    count = [0, 0]
    try:
        encoder = write.Encoder(framing)
        more, done = decoder.feed(b"")  # what came with the head (a body of 0 ends here)
        got += more
        up_writer.write(head + encoder.data(bytes(got)) + (encoder.end() if done else b""))
        await up_writer.drain()
        count[0] += len(got)
        # The answer with the secrets sent masked (proxy/mask.py): a host that
        # says the request back does not give the agent the secret.
        needles = [f for i in applies if i.name in secrets
                   for f in mask.forms(secrets[i.name],
                                       inject.credential_value(i, secrets[i.name]),
                                       i.username if i.kind == "git" or i.value == "basic"
                                       else "")]
        hide = mask.Mask(needles)
        back = asyncio.create_task(_back(up_reader, writer, req.method, hide, count) if hide
                                   else _copy(up_reader, writer, count, 1))
        forth = asyncio.create_task(_copy_body(reader, up_writer, decoder, encoder, count)
                                    if not done else asyncio.sleep(0))
        try:
            await back  # the response ends the exchange (Connection: close)
        finally:
            forth.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await forth
    finally:
        out.sent, out.received = count
        # Aborted, not closed: the answer is read whole (often before the host
        # closed), and a TLS close would still be under way, registered in
        # the loop under the descriptor, when the caller closes `up`; the
        # number, reused by the agent's next connection, would then lose its
        # registration to the late close (that connection never answered).
        up_writer.transport.abort()
    return out
