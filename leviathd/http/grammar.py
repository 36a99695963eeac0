"""The bytes RFC 9110/9112 allow in a message head, as checks: pure.

Stricter than h11 (which ends a line at a bare LF, unfolds obs-fold and lets
controls other than NUL and whitespace into values): what passes here is
read the same way by every parser the message may meet further on.
"""

from __future__ import annotations

import re

MAX_HEADERS = 100
MAX_NAME = 128
MAX_VALUE = 8192
MAX_TARGET = 8192

# tchar (RFC 9110 5.6.2).
TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
# field-value: field-vchar (VCHAR / obs-text) with SP/HTAB only between them.
VALUE = re.compile(rb"(?:[\x21-\x7e\x80-\xff](?:[ \t]*[\x21-\x7e\x80-\xff])*)?\Z")
# A request target as it may stand in a request line: VCHAR only.
TARGET = re.compile(rb"[\x21-\x7e]+\Z")
VERSION = re.compile(rb"HTTP/1\.[01]\Z")
STATUS = re.compile(rb"HTTP/1\.[01] [0-9]{3}(?: [\t \x21-\x7e\x80-\xff]*)?\Z")


class BadMessage(ValueError):
    """A message outside the grammar, or framed two ways: it is refused."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


def check_name(name: bytes) -> None:
    if len(name) > MAX_NAME or not TOKEN.match(name):
        raise BadMessage("a header name that is not a token")


def check_value(value: bytes) -> None:
    if len(value) > MAX_VALUE or not VALUE.match(value):
        raise BadMessage("a header value with a byte outside RFC 9110 (a control, CR, LF or "
                         "NUL) or too long")


def head_lines(raw: bytes) -> list[bytes]:
    """The lines of a head given up to and with its blank line. Every line
    ends in CRLF; a CR or LF anywhere else, or a line that begins with space
    or tab (obs-fold), is refused."""
    if not raw.endswith(b"\r\n\r\n"):
        raise BadMessage("the head does not end in a blank line")
    lines = raw[:-4].split(b"\r\n")
    for line in lines:
        if b"\r" in line or b"\n" in line:
            raise BadMessage("a CR, LF or NUL inside a line of the head (a bare CR or LF)")
        if b"\0" in line:
            raise BadMessage("a CR, LF or NUL inside a line of the head (a NUL)")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadMessage("too many headers", 431)
    return lines


def header_line(line: bytes) -> tuple[bytes, bytes]:
    name, sep, value = line.partition(b":")
    if not sep or line[:1] in (b" ", b"\t"):
        raise BadMessage("a malformed header line (or obs-fold)")
    check_name(name)
    value = value.strip(b" \t")
    check_value(value)
    return name, value
