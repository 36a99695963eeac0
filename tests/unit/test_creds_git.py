"""The pure parts of git credentials (issue 15 §3): which credential covers
a URL for which operation, what git's helper sends and prints, and the git
configuration the sandbox gets."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from leviathd.broker import gitcreds as git
from leviathd.cli import credhelper as helper
from leviathd.creds import service
from leviathd.domain.credentials import CredentialSpec
from leviathd.errors import InvalidArgument, NotFound
from leviathd.policy.permissions import permission_for


def spec(**kw: object) -> CredentialSpec:
    base: dict[str, object] = {"command": (), "secret_file": "/t", "kind": "git",
                               "hosts": ("github.com",)}
    base.update(kw)
    return CredentialSpec(**base)  # type: ignore[arg-type]


def test_a_host_pattern_covers_its_scheme_default_port_or_the_port_it_names() -> None:
    creds = {"a": spec(hosts=("*.example.com", "127.0.0.1:8080"), allow_http=True)}
    assert git.pick(creds, "git_fetch", "https://git.example.com/x.git")[0] == "a"
    assert git.pick(creds, "git_fetch", "http://127.0.0.1:8080/r")[0] == "a"
    for url in ("https://example.com/x", "https://git.example.com:8443/x",
                "http://127.0.0.1:8081/r", "https://evil.com/git.example.com"):
        with pytest.raises(NotFound):
            git.pick(creds, "git_fetch", url)


def test_plain_http_is_served_only_when_the_credential_allows_it() -> None:
    with pytest.raises(NotFound):
        git.pick({"a": spec()}, "git_fetch", "http://github.com/o/r")


def test_push_needs_a_credential_that_allows_push() -> None:
    creds = {"read": spec(), "write": spec(access=("push",))}
    assert git.pick(creds, "git_fetch", "https://github.com/o/r")[0] == "read"
    assert git.pick(creds, "git_push", "https://github.com/o/r")[0] == "write"
    with pytest.raises(NotFound):
        git.pick({"read": spec()}, "git_push", "https://github.com/o/r")


@pytest.mark.parametrize("url", ["https://u:p@github.com/r", "https://github.com/r?x=1",
                                 "ftp://github.com/r", "https://github.com/a b",
                                 "https://github.com/" + "a" * 3000])
def test_urls_git_would_not_send_are_refused(url: str) -> None:
    with pytest.raises(InvalidArgument):
        git.parse_url(url)


def test_a_token_with_a_line_break_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        git.check_token("abc\npassword=x")


def test_git_push_asks_by_default_and_git_fetch_is_allowed() -> None:
    assert permission_for("git_push", {}).permission == "ask"
    assert permission_for("git_fetch", {}).permission == "allow"
    assert permission_for("git_push", {"git_push": "allow"}).permission == "allow"


def test_the_helper_reads_only_the_fields_it_knows_and_bounds_the_input() -> None:
    got = helper.read_request(b"protocol=https\nhost=h\npath=o/r.git\nwwwauth[]=x\n\nhost=late\n")
    assert got == {"protocol": "https", "host": "h", "path": "o/r.git"}
    assert helper.read_request(b"host=" + b"a" * 100_000) == {"host": "a" * (65536 - 5)}


def test_the_helper_answers_store_and_erase_with_nothing() -> None:
    assert helper.git_credential("store", b"protocol=https\nhost=h\npassword=p\n") == (0, "", "")


def test_a_git_push_above_the_helper_is_seen() -> None:
    # A process whose command line is `git push`, with this one as its child.
    proc = subprocess.Popen(["git", "-c", "import time; time.sleep(5)", "push"],
                            executable=sys.executable)
    try:
        import time
        for _ in range(50):
            if helper._cmdline(proc.pid)[:1] == ["git"]:
                break
            time.sleep(0.02)
        assert helper.started_by_push(proc.pid)
        assert not helper.started_by_push(os.getpid())
    finally:
        proc.kill()
        proc.wait()


def test_the_sandbox_git_config_makes_the_helper_the_only_one_for_covered_urls() -> None:
    creds = {"g": SimpleNamespace(kind="git", hosts=["github.com", "h?st"], allow_http=True),
             "c": SimpleNamespace(kind="command", hosts=[])}
    env = service.git_config(creds, "/run/leviath/bin/git-credential-leviath")
    pairs = [(env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"])
             for i in range(int(env["GIT_CONFIG_COUNT"]))]
    assert pairs[:3] == [("credential.https://github.com.helper", ""),
                         ("credential.https://github.com.helper",
                          "/run/leviath/bin/git-credential-leviath"),
                         ("credential.https://github.com.useHttpPath", "true")]
    assert ("credential.http://github.com.helper", "") in pairs
    assert ("credential.helper", "/run/leviath/bin/git-credential-leviath") in pairs
    assert service.git_config({"c": creds["c"]}, "x") == {}


def test_wrappers_are_named_by_wrap_or_the_programs_name() -> None:
    creds = {"gh": SimpleNamespace(kind="cli", wrap=None, command=["/usr/bin/gh"]),
             "gl": SimpleNamespace(kind="cli", wrap="glab", command=["glab-real"])}
    assert service.wrappers(creds) == {"gh": "gh", "glab": "gl"}
    files = service.programs(creds)
    assert set(files) == {"gh", "glab"}
    assert b"leviathd.cli.credhelper run gh \"$@\"" in files["gh"]


def test_the_credential_tool_refuses_a_git_or_ssh_credential() -> None:
    import asyncio

    from leviathd.broker.credentials import run_credential

    for kind in ("git", "ssh"):
        with pytest.raises(InvalidArgument, match="not a command"):
            asyncio.run(run_credential(
                spec(kind=kind), [], opener=None, uid=0, gid=0,  # type: ignore[arg-type]
                groups=[], home="/", agent_id="a", runner=None))


@pytest.mark.parametrize("body", [
    'kind = "ssh"\nsecret_file = "/t"',                       # no hosts
    'kind = "cli"\ncommand = ["gh"]\nsecret_file = "/t"',     # no token_env
    'kind = "git"\nhosts = ["a b"]\nsecret_file = "/t"',      # not a host pattern
    'kind = "git"\nhosts = ["h"]\naccess = []\nsecret_file = "/t"',
    'kind = "cli"\ncommand = ["gh"]\ntoken_env = "T"\nwrap = "../gh"\nsecret_file = "/t"',
    'secret_file = "/t"',                                      # a command credential needs one
])
def test_credential_kinds_refuse_what_they_cannot_use(body: str) -> None:
    import tomllib

    from pydantic import ValidationError

    from leviathd.config.models import Config

    with pytest.raises(ValidationError):
        Config.model_validate(tomllib.loads("[credentials.x]\n" + body))
