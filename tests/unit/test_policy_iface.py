"""The org.leviath.Policy1 interface as the bus sees it: its methods and
signal with the documented signatures (a typo here is a daemon that does not
start, so it is checked without one)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from dbus_fast.service import ServiceInterface

from leviathd.bus.names import POLICY_IFACE
from leviathd.bus.policy_iface import PolicyInterface


def test_policy1_has_the_documented_methods_and_signal() -> None:
    gate: Any = SimpleNamespace(on_approval_requested=[])
    iface = PolicyInterface(None, None, gate, None, None)  # type: ignore[arg-type]
    assert iface.name == POLICY_IFACE == "org.leviath.Policy1"
    methods = {m.name: (m.in_signature, m.out_signature)
               for m in ServiceInterface._get_methods(iface)}
    assert methods == {
        "ListApprovals": ("", "aa{sv}"),
        "Answer": ("ss", ""),
        "PolicyAdd": ("sss", "s"),
        "RuleAdd": ("ssss", "s"),
        "PolicyList": ("", "aa{sv}"),
    }
    signals = {s.name: s.signature for s in ServiceInterface._get_signals(iface)}
    assert signals == {"ApprovalRequested": "ssu"}
    # The gate service's requests reach the signal.
    assert gate.on_approval_requested == [iface._emit]
