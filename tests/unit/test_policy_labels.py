from __future__ import annotations

import pytest

from leviathd.domain.sensitivity import Sensitivity
from leviathd.domain.tools import TOOLS
from leviathd.errors import InvalidArgument
from leviathd.policy.labels import clearance_for, label_for
from leviathd.policy.permissions import permission_for

P, N, X = Sensitivity.PUBLIC, Sensitivity.INTERNAL, Sensitivity.PRIVATE


def test_sensitivity_is_ordered_public_internal_private() -> None:
    assert P < N < X


def test_sensitivity_parses_config_spellings_and_refuses_others() -> None:
    assert Sensitivity.parse("Private") is X
    with pytest.raises(InvalidArgument):
        Sensitivity.parse("secret")


def test_runtime_labels_per_tool() -> None:
    assert label_for("read_file", outside_workdir=False) is N
    assert label_for("list_dir", outside_workdir=True) is X
    assert label_for("web_fetch", outside_workdir=False) is P
    assert label_for("credential", outside_workdir=False) is X


def test_every_outbound_tool_has_a_clearance_and_local_tools_none() -> None:
    for tool in ("web_fetch", "http_get", "http_post", "credential"):
        assert clearance_for(tool, {}, network=True) is N
    for tool in ("read_file", "write_file", "edit_file", "list_dir"):
        assert clearance_for(tool, {}, network=True) is None
    assert clearance_for("http_post", {"http_post": "public"}, network=True) is P


def test_known_tools_default_to_allow_and_unknown_tools_to_deny() -> None:
    # But a push token, which asks (issue 15).
    assert {t: permission_for(t, {}).permission for t in TOOLS
            if permission_for(t, {}).permission != "allow"} == {"git_push": "ask"}
    assert permission_for("web_search", {"web_search": "allow"}).permission == "deny"
