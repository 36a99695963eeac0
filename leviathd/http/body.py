"""A body read through h11 as decoded data (chunk framing gone), and the
bytes that follow it (issue 44)."""

from __future__ import annotations

import h11

from leviathd.http.grammar import BadMessage
from leviathd.http.message import ResponseHead, parse_response


class Decoder:
    """Feeds the bytes that come after a head (http/message.py) to the h11
    connection that read it; `feed` gives the body's data so far and whether
    it ended. Trailers are read and dropped."""

    def __init__(self, conn: h11.Connection) -> None:
        self._conn = conn
        self.done = False

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """`data` added (b"": nothing new, what is buffered is decoded)."""
        if self.done:
            if data:
                self._conn.receive_data(data)  # kept for `rest`, never decoded
            return b"", True
        if data:
            self._conn.receive_data(data)
        return self._events()

    def _events(self) -> tuple[bytes, bool]:
        out = bytearray()
        try:
            while True:
                event = self._conn.next_event()
                if isinstance(event, h11.Data):
                    out += event.data
                elif isinstance(event, h11.EndOfMessage):
                    self.done = True
                    return bytes(out), True
                elif event is h11.NEED_DATA:
                    return bytes(out), False
                else:  # ConnectionClosed, PAUSED: the body did not end
                    raise BadMessage("the connection ended inside the body")
        except h11.RemoteProtocolError as exc:
            raise BadMessage(f"a malformed body: {exc}") from None

    def end(self) -> tuple[bytes, bool]:
        """The peer closed: a body framed by the end of the connection ends
        here; any other one is cut short (False)."""
        if self.done:
            return b"", True
        self._conn.receive_data(b"")
        try:
            return self._events()
        except BadMessage:
            return b"", False

    @property
    def rest(self) -> bytes:
        """What came after the body's end (a next, pipelined request)."""
        return self._conn.trailing_data[0]


def whole_response(raw: bytes, method: str = "GET") -> tuple[ResponseHead, bytes]:
    """A whole answer read to the end of the connection (bounded by the
    caller): its head and its decoded body. One that ends before its body
    does is refused."""
    end = raw.find(b"\r\n\r\n")
    if end < 0:
        raise BadMessage("the answer has no end of head")
    head, conn = parse_response(raw[:end + 4], method)
    decoder = Decoder(conn)
    data, done = decoder.feed(raw[end + 4:])
    if not done:
        more, done = decoder.end()
        data += more
    if not done:
        raise BadMessage("the answer ends before its body does")
    return head, data
