"""What `lev` prints for people: strings an agent could choose (targets, tool
names, reasons, ids, blueprint fields) with their control characters escaped,
so an agent cannot move the cursor, rewrite a prompt, set the terminal title
or forge a line on someone's screen (issue 20 §5).

`field` is for one value inside a line (a newline in it is escaped too);
`lines` is for text that may span lines; `EscapingStream` guards every print
of a command whose output is meant for a person."""

from __future__ import annotations

import codecs
import io
import unicodedata

# typing imports re; mypy reads any TYPE_CHECKING as true (issue 18: start-up).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, TextIO

# Format characters that reorder or hide text on screen (bidi overrides,
# isolates, zero-width joiners): as misleading as a cursor move.
_INVISIBLE = frozenset(
    "\u061c\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
    "\u2060\u2066\u2067\u2068\u2069\ufeff"
)


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _needs_escape(ch: str) -> bool:
    return ch in _INVISIBLE or unicodedata.category(ch) in ("Cc", "Cs")


def _clean(text: str, keep: str) -> str:
    if text.isprintable() and "\\" not in text:
        return text
    out: list[str] = []
    for ch in text:
        if ch in keep:
            out.append(ch)
        elif ch == "\\":
            # Doubled, so "\x1b" typed by an agent never passes for an escape.
            out.append("\\\\")
        elif _needs_escape(ch):
            out.append(_escape(ch))
        else:
            out.append(ch)
    return "".join(out)


def field(value: object) -> str:
    """One value for a table cell or a prompt: every control character,
    newline and tab included, escaped."""
    return _clean(str(value), "")


def lines(text: str) -> str:
    """Text that may span lines: newlines and tabs kept, all other control
    characters escaped. Backslashes are left alone (paths and messages
    written by people use them)."""
    if text.isprintable():
        return text
    return "".join(
        ch if ch in "\n\t" or not _needs_escape(ch) else _escape(ch) for ch in text
    )


class EscapingStream(io.TextIOBase):
    """A text stream that passes everything through `lines` on its way to
    the real one: the net under every print of a command (a field a command
    forgot to pass through `field` still cannot reach the terminal raw)."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, s: str) -> int:
        self._inner.write(lines(s))
        return len(s)

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return self._inner.isatty()

    def fileno(self) -> int:
        return self._inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._inner.encoding

    @property
    def buffer(self) -> BinaryIO:
        return self._inner.buffer


class OutputFilter:
    """An agent's output bytes made safe for a terminal, chunk by chunk (a
    UTF-8 character or a line may be split across reads): invalid bytes as
    \\xNN, control characters other than newline and tab escaped."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")

    def feed(self, chunk: bytes, *, final: bool = False) -> bytes:
        return lines(self._decoder.decode(chunk, final)).encode("utf-8", "backslashreplace")
