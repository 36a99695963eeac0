"""leviathd/sandbox/container/pins.py: a name runs as the ID it had when the
configuration loaded, until the next reload."""

from __future__ import annotations

import asyncio

import pytest

from leviathd.sandbox.container import pins

A, B = "a" * 64, "b" * 64


def test_a_pin_holds_over_a_retag_until_a_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    tags = {"img:1": A}
    monkeypatch.setattr(pins, "resolve", lambda _engine, image: tags.get(image))

    async def go() -> list[str]:
        pins.reload({("podman", "img:1")})
        first = await pins.pinned("podman", "img:1")
        tags["img:1"] = B  # retagged
        second = await pins.pinned("podman", "img:1")
        pins.reload({("podman", "img:1")})
        third = await pins.pinned("podman", "img:1")
        return [first, second, third]

    assert asyncio.run(go()) == [A, A, B]


def test_a_name_unknown_at_load_is_pinned_at_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    tags: dict[str, str] = {}
    monkeypatch.setattr(pins, "resolve", lambda _engine, image: tags.get(image))

    async def go() -> list[str]:
        pins.reload({("podman", "late:1")})
        missing = await pins.pinned("podman", "late:1")
        tags["late:1"] = A
        first = await pins.pinned("podman", "late:1")
        tags["late:1"] = B
        return [missing, first, await pins.pinned("podman", "late:1")]

    assert asyncio.run(go()) == ["late:1", A, A]
