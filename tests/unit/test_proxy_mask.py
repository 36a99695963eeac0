"""The proxy masks the secrets it put into a request in what the covered
host sends back (proxy/mask.py): whatever the pieces the answer comes in,
the agent gets the answer with each secret replaced by as many `*`, and
nothing else changed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from leviathd.proxy.mask import Mask

SECRET = "tok-5ecret-0123456789"


def run(secrets: list[str], pieces: list[bytes]) -> bytes:
    m = Mask(secrets)
    return b"".join(m.feed(p) for p in pieces) + m.flush()


def test_a_secret_split_over_pieces_is_masked() -> None:
    data = b'{"authorization": "Bearer ' + SECRET.encode() + b'"}'
    for cut in range(len(data) + 1):
        got = run([SECRET], [data[:cut], data[cut:]])
        assert got == data.replace(SECRET.encode(), b"*" * len(SECRET)), cut


def test_a_short_secret_is_not_masked_and_no_secret_leaves_the_stream_alone() -> None:
    assert run(["short"], [b"a short answer"]) == b"a short answer"
    assert not Mask([])
    assert run([], [b"x", b"y"]) == b"xy"


@given(st.lists(st.binary(max_size=40), max_size=8), st.integers(0, 7))
def test_any_pieces_give_the_masked_whole(parts: list[bytes], where: int) -> None:
    parts = list(parts)
    parts.insert(min(where, len(parts)), SECRET.encode())
    whole = b"".join(parts)
    want = whole.replace(SECRET.encode(), b"*" * len(SECRET))
    assert run([SECRET], parts) == want
    assert run([SECRET], [whole[i:i + 3] for i in range(0, len(whole), 3)]) == want
