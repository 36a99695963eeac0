"""Issue 49 item 3, the pure and file parts: the user's registry logins are
read from docker's and podman's files (by descriptor, no link followed, in
podman's order), each becomes an injection toward its registry alone, and
the egress puts `Authorization: Basic` in only where the agent sent no
header of its own (tests/integration/test_engine_registry.py is the pull
through a real registry stand-in, with the attacker's side)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from leviathd.config.load import parse_blueprint, parse_config
from leviathd.config.merge import MergeResult, resolve
from leviathd.proxy import inject, registries
from leviathd.proxy.service import registry_logins

KEY = b"k" * 32


def _auth(user: str, password: str) -> dict[str, str]:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


def _write(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def _read(home: Path, runtime: Path) -> registries.Found:
    return registries.read_logins(os.getuid(), os.getgid(), str(home), str(runtime))


@pytest.fixture()
def places(tmp_path: Path) -> tuple[Path, Path]:
    home, runtime = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    runtime.mkdir()
    return home, runtime


def test_the_auth_keys_docker_and_podman_write_name_a_registry_host() -> None:
    assert registries.host_of("https://index.docker.io/v1/") == "docker.io"
    assert registries.host_of("docker.io") == "docker.io"
    assert registries.host_of("registry.example.com:5000") == "registry.example.com:5000"
    assert registries.host_of("https://Ghcr.IO") == "ghcr.io"
    assert registries.host_of("quay.io/team/repo") == "quay.io"
    assert registries.host_of("r.example.com:443") == "r.example.com"
    for bad in ("", "*.example.com", "a b", "host:99999", "host:0", "..", "x?y", "[::1]"):
        assert registries.host_of(bad) is None, bad
    assert registries.hosts_for("docker.io") == ("registry-1.docker.io", "auth.docker.io")
    assert registries.hosts_for("quay.io") == ("quay.io",)


def test_logins_are_read_in_podmans_order_with_notes_on_what_is_not_used(
        places: tuple[Path, Path]) -> None:
    home, runtime = places
    _write(runtime / "containers" / "auth.json", {"auths": {"a.test": _auth("run", "pw-run")}})
    _write(home / ".config" / "containers" / "auth.json",
           {"auths": {"a.test": _auth("cfg", "pw-cfg"), "b.test:5000": _auth("cfg", "pw-b")}})
    _write(home / ".docker" / "config.json", {
        "auths": {"https://index.docker.io/v1/": {"username": "hub", "password": "pw-hub"},
                  "b.test:5000": _auth("docker", "pw-late"),
                  "helper.test": {},
                  "*.bad": _auth("x", "y"),
                  "nocolon.test": {"auth": base64.b64encode(b"nocolon").decode()},
                  "broken.test": {"auth": "%%%"}},
        "credHelpers": {"ecr.test": "ecr-login"}})
    found = _read(home, runtime)
    assert found.logins == {"a.test": "run:pw-run", "b.test:5000": "cfg:pw-b",
                            "docker.io": "hub:pw-hub"}
    text = "\n".join(found.notes)
    assert "credential helper" in text and "helper.test" in text and "*.bad" in text
    assert "nocolon.test" in text and "broken.test" in text
    assert "pw-" not in text  # no value in a note (they go to the journal)


def test_a_link_in_place_of_an_auth_file_or_its_folder_is_not_followed(
        places: tuple[Path, Path], tmp_path: Path) -> None:
    home, runtime = places
    _write(tmp_path / "elsewhere" / "config.json", {"auths": {"x.test": _auth("u", "p")}})
    _write(tmp_path / "elsewhere" / "auth.json", {"auths": {"y.test": _auth("u", "p")}})
    (home / ".docker").mkdir()
    (home / ".docker" / "config.json").symlink_to(tmp_path / "elsewhere" / "config.json")
    (runtime / "containers").symlink_to(tmp_path / "elsewhere")
    found = _read(home, runtime)
    assert found.logins == {}
    assert any("not a regular file" in n for n in found.notes), found.notes


def test_an_oversized_or_unreadable_file_gives_a_note_not_a_failure(
        places: tuple[Path, Path]) -> None:
    home, runtime = places
    (home / ".docker").mkdir()
    (home / ".docker" / "config.json").write_bytes(b"{" + b" " * registries.MAX_SIZE + b"}")
    _write(home / ".config" / "containers" / "auth.json", ["not", "an", "object"])
    found = _read(home, runtime)
    assert found.logins == {} and len(found.notes) == 2, found.notes


def test_each_login_is_one_injection_toward_its_registry_alone(
        places: tuple[Path, Path]) -> None:
    home, runtime = places
    _write(home / ".docker" / "config.json", {"auths": {
        "reg.test:5000": _auth("u", "p1"), "docker.io": _auth("h", "p2")}})
    injs = registries.injections(_read(home, runtime), KEY)
    by_name = {i.name: i for i in injs}
    assert set(by_name) == {"registry/reg.test:5000", "registry/docker.io"}
    reg = by_name["registry/reg.test:5000"]
    assert reg.kind == "registry" and reg.hosts == ("reg.test:5000",)
    assert inject.covers(reg, "reg.test", 5000)
    assert not inject.covers(reg, "reg.test", 443) and not inject.covers(reg, "other.test", 5000)
    assert by_name["registry/docker.io"].hosts == registries.DOCKER_HUB
    assert registries.read_secret("registry/reg.test:5000", os.getuid(), os.getgid(),
                                  str(home), str(runtime)) == "u:p1"
    with pytest.raises(LookupError):
        registries.read_secret("registry/gone.test", os.getuid(), os.getgid(), str(home),
                               str(runtime))


def test_the_login_goes_only_into_a_request_with_no_authorization_of_its_own() -> None:
    """The attacker's side: the agent's forged header is kept as its own (the
    registry refuses it); the user's login is never added beside it."""
    inj = registries.injections(registries.Found({"reg.test": "u:real-pw"}), KEY)[0]
    secrets = {inj.name: "u:real-pw"}
    basic = base64.b64encode(b"u:real-pw").decode()
    req = inject.parse_head(b"GET /v2/ HTTP/1.1\r\nHost: reg.test")
    head, used = inject.rebuild(req, [inj], secrets, host="reg.test")
    assert f"Authorization: Basic {basic}\r\n".encode() in head and used == [inj.name]
    req = inject.parse_head(b"GET /v2/ HTTP/1.1\r\nHost: reg.test\r\n"
                            b"Authorization: Basic Zm9yZ2VkOm5vcGU=")
    head, used = inject.rebuild(req, [inj], secrets, host="reg.test")
    assert used == [] and basic.encode() not in head
    assert b"Authorization: Basic Zm9yZ2VkOm5vcGU=\r\n" in head
    # A registry's bearer token (after the token flow) is the client's own.
    req = inject.parse_head(b"GET /v2/x/manifests/1 HTTP/1.1\r\nHost: reg.test\r\n"
                            b"Authorization: Bearer tok")
    head, used = inject.rebuild(req, [inj], secrets, host="reg.test")
    assert used == [] and b"Authorization: Bearer tok\r\n" in head


@pytest.mark.parametrize("head", [
    b"POST /v2/app/blobs/uploads/ HTTP/1.1",
    b"PUT /v2/app/manifests/latest HTTP/1.1",
    b"PATCH /v2/app/blobs/uploads/u1 HTTP/1.1",
    b"DELETE /v2/app/manifests/sha256:00 HTTP/1.1",
    b"GET /token?service=reg.test&scope=repository:app:push,pull HTTP/1.1",
    b"GET /token?service=reg.test&scope=repository:app:pull&scope=repository:app:push HTTP/1.1",
    b"GET /token?scope=repository:app:pull%20repository:app:push HTTP/1.1",
    b"GET /token?scope=repository:app:* HTTP/1.1",
    b"GET /token?scope=registry:catalog:* HTTP/1.1",
    b"GET /token?SCOPE=repository:app:delete HTTP/1.1",
    b"POST /token HTTP/1.1",
])
def test_the_login_never_writes_to_the_registry(head: bytes) -> None:
    """The attacker's side (red team of issue 49 item 3): the agent's own
    curl through its proxy, with no Authorization, toward the registry: an
    upload, a manifest write or delete, a token with push, `*` or delete
    rights gets no login."""
    inj = registries.injections(registries.Found({"reg.test": "u:real-pw"}), KEY)[0]
    req = inject.parse_head(head + b"\r\nHost: reg.test")
    assert inject.applying([inj], req) == []


@pytest.mark.parametrize("head", [
    b"GET /v2/ HTTP/1.1", b"HEAD /v2/app/manifests/latest HTTP/1.1",
    b"GET /v2/app/blobs/sha256:00 HTTP/1.1",
    b"GET /token?service=reg.test&scope=repository:team/app:pull HTTP/1.1",
    b"GET /token?scope=repository:a:pull+repository:b:pull&account=u HTTP/1.1",
])
def test_a_pull_gets_the_login(head: bytes) -> None:
    inj = registries.injections(registries.Found({"reg.test": "u:real-pw"}), KEY)[0]
    assert inject.applying([inj], inject.parse_head(head + b"\r\nHost: reg.test")) == [inj]


def _merged(machine: str) -> MergeResult:
    bp = parse_blueprint('[agent]\nname = "a"\ncommand = ["run"]\n', "b.toml")
    return resolve(parse_config(machine, "m.toml"), None, bp, "a")


def test_only_an_agent_whose_own_engine_pulls_through_its_proxy_gets_the_logins() -> None:
    """An agent with no engine (or a root engine, whose pulls do not go
    through the agent's proxy) is not given the use of the user's registry
    logins."""
    base = '[sandbox]\nkind = "namespace"\nnetwork = "proxy"\n'
    on = base + "[sandbox.containers]\nenabled = true\n"
    assert registry_logins("namespace", _merged(on))
    assert not registry_logins("namespace", _merged(base))
    assert not registry_logins("none", _merged(on))
    assert not registry_logins("namespace", _merged(on.replace('"proxy"', "true")))
    assert not registry_logins("namespace", _merged(on + "host_root_engine = true\n"))
