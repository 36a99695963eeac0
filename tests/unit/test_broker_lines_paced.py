"""The broker's request lines are charged to their user as they are read
(leviathd/broker/requests.Lines with `pace`): every byte, whether its line is
then served, refused or dropped as too long. A line refused after it was read
(over the agent's concurrency, or too long) cost the loop its reading
unpaced, and a flood of them kept the loop busy (bench/neighbour_bench.py,
"broker")."""

from __future__ import annotations

import asyncio

import pytest

from leviathd.broker.requests import CHUNK, Lines, TooLong


def _lines(data: bytes, limit: int) -> tuple[list[bytes | str], int]:
    charged = [0]

    async def pace(n: int) -> None:
        charged[0] += n

    async def main() -> list[bytes | str]:
        reader = asyncio.StreamReader(limit=CHUNK)
        reader.feed_data(data)
        reader.feed_eof()
        lines = Lines(reader, pace=pace)
        got: list[bytes | str] = []
        while True:
            try:
                line = await lines.next(limit)
            except TooLong:
                got.append("too long")
                continue
            if line is None:
                return got
            got.append(line)

    return asyncio.run(main()), charged[0]


def test_every_byte_read_is_charged_including_a_dropped_line() -> None:
    big = b"x" * (5 * CHUNK)
    data = b"a\n" + big + b"\n" + b"b\n"
    got, charged = _lines(data, limit=CHUNK)
    assert got == [b"a", "too long", b"b"]
    assert charged == len(data)


@pytest.mark.parametrize("n", [1, 3])
def test_ordinary_lines_are_charged_once(n: int) -> None:
    data = b"".join(b'{"op": "call"}\n' for _ in range(n))
    got, charged = _lines(data, limit=1 << 20)
    assert got == [b'{"op": "call"}'] * n
    assert charged == len(data)
