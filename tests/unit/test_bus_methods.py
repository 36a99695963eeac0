"""Every method of the bus interfaces states the rights (polkit actions) it
involves (leviathd/bus/method.py), and together they are the actions the
polkit policy file defines: an action no method names, or a method that names an
action polkit does not know, fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from leviathd.authority import Right
from leviathd.bus import polkit
from leviathd.bus.manager_iface import ManagerInterface
from leviathd.bus.method import DECLARATION, Declared
from leviathd.bus.policy_iface import PolicyInterface

POLICY_FILE = Path(__file__).resolve().parents[2] / "polkit" / "org.leviath.policy"


def _declared(cls: type) -> dict[str, Declared]:
    out: dict[str, Declared] = {}
    for name, fn in vars(cls).items():
        if not hasattr(fn, "__dict__") or "__DBUS_METHOD" not in fn.__dict__:
            continue
        inner = fn
        found = None
        while inner is not None and found is None:
            found = getattr(inner, DECLARATION, None)
            inner = getattr(inner, "__wrapped__", None)
        assert isinstance(found, Declared), f"{cls.__name__}.{name} has no bus_method declaration"
        out[name] = found
    return out


@pytest.mark.parametrize("cls", [ManagerInterface, PolicyInterface])
def test_every_bus_method_declares_its_polkit_actions(cls: type) -> None:
    methods = _declared(cls)
    assert methods, "no D-Bus methods found: the dbus-fast marker changed?"
    for name, d in methods.items():
        assert d.needs is not None or d.asks, f"{name} states no polkit action"


def test_the_declared_actions_are_the_policy_files() -> None:
    used: set[str] = set()
    for cls in (ManagerInterface, PolicyInterface):
        for d in _declared(cls).values():
            used |= d.actions
    defined = set(re.findall(r'<action id="([^"]+)"', POLICY_FILE.read_text()))
    assert used == defined
    # Every right a service can name has its action in the file.
    assert set(polkit.ACTIONS) == set(Right)
    assert set(polkit.ACTIONS.values()) == defined
