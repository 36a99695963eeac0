"""Red team, issue 13 (the agent's container engine socket): the engine
decodes the Docker API's JSON the way Go's encoding/json does, matching an
object's keys to its fields whatever their case. A check reading only the
exact spelling (`HostConfig`, `Privileged`) lets `hostConfig` or
`privileged` through to the engine: a privileged container, root on the
host, from inside an agent.

The bed, image and client are test_engine_socket.py's."""

from __future__ import annotations

import json

import pytest
from test_engine_socket import BED_HOST_CONFIG, IMAGE, _podman, agent, bed  # noqa: F401
from testbed import Testbed

pytestmark = pytest.mark.testbed


@pytest.mark.parametrize(
    "body",
    [
        {"Image": IMAGE, "Cmd": ["true"], "HostConfig": {**BED_HOST_CONFIG, "privileged": True}},
        {"Image": IMAGE, "Cmd": ["true"], "hostConfig": {**BED_HOST_CONFIG, "Privileged": True}},
        {"Image": IMAGE, "Cmd": ["true"], "HostConfig": dict(BED_HOST_CONFIG),
         "hostconfig": {**BED_HOST_CONFIG, "PRIVILEGED": True}},
        {"Image": IMAGE, "Cmd": ["true"], "HostConfig": {**BED_HOST_CONFIG, "pidMode": "host"}},
        {"Image": IMAGE, "Cmd": ["true"], "HostConfig": {**BED_HOST_CONFIG, "binds": ["/:/host"]}},
    ],
    ids=["privileged-lower", "hostconfig-camel", "hostconfig-twice", "pidmode-camel",
         "binds-lower"],
)
def test_a_key_spelt_in_another_case_is_checked_all_the_same(
    bed: Testbed, body: dict[str, object],  # noqa: F811
) -> None:
    out = agent(bed, "alice", ["POST", "/containers/create?name=redteam-case", body],
                ["GET", "/containers/json?all=1", None],
                ["GET", "/containers/redteam-case/json", None])
    assert isinstance(out, list)
    status, reply = out[0]
    try:
        if status == 201:
            host = out[2][1].get("HostConfig", {})  # type: ignore[union-attr]
            raise AssertionError(f"created: privileged={host.get('Privileged')} "
                                 f"pid={host.get('PidMode')} binds={host.get('Binds')}")
        assert status in (400, 403), out
        assert str(reply["message"]).startswith("leviathd: "), reply  # type: ignore[index]
        assert out[1] == [200, []], out[1]
    finally:
        for cid in _podman(bed, "ps", "-a", "-q", "--filter",
                           "label=org.leviath.engine-agent").split():
            bed.run(["podman", "rm", "-f", cid], check=False)
    assert json.dumps(out)
