"""The agent scope's properties as StartTransientUnit gets them."""

from __future__ import annotations

from leviathd.systemd.manager import ScopeLimits, scope_properties


def _props(**kw: bool) -> dict[str, object]:
    props = scope_properties(pids=[42], slice_name="leviath.slice", description="agent",
                             limits=ScopeLimits(memory_max=2**28, tasks_max=512), **kw)
    return {name: v.value for name, v in props}


# Seen on Debian 13 (tests/vm/, systemd 257): with systemd's DefaultOOMPolicy=stop
# for scopes, the memory hog's kernel kill stopped the whole scope, supervisor
# included, and `lev run` ended with status 1 and no exit status instead of 137.
def test_an_oom_kill_inside_the_scope_does_not_stop_the_scope() -> None:
    props = _props()
    assert props["OOMPolicy"] == "continue"
    assert props["MemoryMax"] == 2**28 and props["MemorySwapMax"] == 0


def test_without_oom_policy_for_systemd_before_253() -> None:
    assert "OOMPolicy" not in _props(oom_policy=False)
