"""The per-user image store's pure parts (leviathd/enginesock/imagestore.py
and imagestore_exec.py): its size key, what the runner is told, and which
images the size bound removes. The bed's tests/integration/
test_engine_images.py drives it from inside real agents."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from leviathd.config.load import parse_config
from leviathd.config.merge import IMAGE_STORE_MAX_DEFAULT, resolve
from leviathd.enginesock import imagestore, imagestore_exec, rootless
from leviathd.identity import UserInfo

MACHINE = '[sandbox.containers]\nenabled = true\nimage_store_max = "3G"\n'


def test_the_bound_defaults_to_2g_and_a_user_only_lowers_it() -> None:
    plain = resolve(parse_config("[sandbox.containers]\nenabled = true\n", "m"), None, None, "a")
    assert plain.agent.containers.image_store_max == IMAGE_STORE_MAX_DEFAULT == 2 << 30
    machine = parse_config(MACHINE, "m")
    assert resolve(machine, None, None, "a").agent.containers.image_store_max == 3 << 30
    lower = parse_config('[sandbox.containers]\nimage_store_max = "1G"\n', "u")
    assert resolve(machine, lower, None, "a").agent.containers.image_store_max == 1 << 30
    none = parse_config("[sandbox.containers]\nimage_store_max = 0\n", "u")
    assert resolve(machine, none, None, "a").agent.containers.image_store_max == 0
    higher = parse_config('[sandbox.containers]\nimage_store_max = "4G"\n', "u")
    got = resolve(machine, higher, None, "a")
    assert got.agent.containers.image_store_max == 3 << 30
    assert "containers-image-store-max-overruled" in {f.code for f in got.findings}


def test_infinity_is_not_a_bound() -> None:
    with pytest.raises(Exception, match="keep no images"):
        parse_config('[sandbox.containers]\nimage_store_max = "infinity"\n', "m")


def test_the_runner_gets_the_users_own_store_and_no_home() -> None:
    alice = UserInfo("alice", 1001, 1001, (1001, 27), "/home/alice")
    o = imagestore.orders("save", "ab12cd34", "/var/lib/leviath", alice, "/usr/bin/podman",
                          5 << 20)
    assert o["store"] == "/var/lib/leviath/image-store/1001"
    assert o["storage"] == "/var/lib/leviath/engine-storage/ab12cd34"
    assert (o["uid"], o["gid"], o["groups"]) == (1001, 1001, [1001, 27])
    # libpod's database names the engine's places: the runner names them alike.
    assert o["agent_flags"] == rootless.storage_flags()
    assert rootless.storage_flags() == rootless.service_argv("/p")[1:9]
    assert not any(p in ("/home", "/root", "/run", "/var") for p in o["system"])


def test_the_bound_removes_the_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    images = [{"Id": "c" * 64, "Names": ["localhost/new:1"], "Created": 300, "Size": 3},
              {"Id": "a" * 64, "Names": ["localhost/old:1"], "Created": 100, "Size": 3},
              {"Id": "b" * 64, "Names": [], "Created": 200, "Size": 3}]
    removed: list[str] = []

    def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        if "rmi" in argv:
            removed.append(argv[-1])
        return subprocess.CompletedProcess(argv, 0, "", "")

    def listed(argv: list[str], env: dict[str, str]) -> list[dict[str, Any]]:
        return images

    monkeypatch.setattr(imagestore_exec, "_run", run)
    monkeypatch.setattr(imagestore_exec, "_images", listed)
    gone = imagestore_exec._prune(["podman"], {}, 4)
    assert removed == ["a" * 64, "b" * 64]
    assert gone == ["localhost/old:1", "b" * 12]
    removed.clear()
    assert imagestore_exec._prune(["podman"], {}, 9) == [] and removed == []


def test_only_names_podman_would_write_are_pushed() -> None:
    image = {"Names": ["localhost/app:1", "docker.io/library/busybox:latest", "--rm",
                       "a]b", "x" * 300, 7, "registry:5000/team/app@sha256:" + "0" * 64]}
    assert imagestore_exec._names(image) == [
        "localhost/app:1", "docker.io/library/busybox:latest",
        "registry:5000/team/app@sha256:" + "0" * 64]
