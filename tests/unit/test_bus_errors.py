"""Issue 50: what a bus method's failure sends back is bounded and names no
internals (bus/errors.py): a refusal's text is cut at REPLY_LIMIT, and an
unexpected exception becomes one fixed line, its text (a path, a secret a
caller planted in an argument) never on the bus."""

from __future__ import annotations

import asyncio

import pytest
from dbus_fast.errors import DBusError

from leviathd.bus import errors
from leviathd.errors import InvalidArgument


def _reply(exc: BaseException) -> DBusError:
    @errors.translated
    async def method() -> None:
        raise exc

    with pytest.raises(DBusError) as caught:
        asyncio.run(method())
    return caught.value


def test_a_refusal_is_cut_at_its_bound() -> None:
    got = _reply(InvalidArgument("x" * 50_000))
    assert got.type == InvalidArgument("").dbus_name
    assert len(got.text) <= errors.REPLY_LIMIT + len(" [...]"), len(got.text)


def test_an_unexpected_failure_says_nothing_of_itself() -> None:
    got = _reply(RuntimeError("/root/.ssh/id_ed25519 s3cr3t"))
    assert got.type == "org.leviath.Error.Failed"
    assert "s3cr3t" not in got.text and "/root" not in got.text, got.text
