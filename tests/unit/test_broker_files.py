"""File tools through a real broker socket on real files: the decision is
taken on the real path of the opened file."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_harness import Running, call, running_broker

from leviathd.cli.tool import BrokerClient
from leviathd.policy.settings import PolicySettings


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    home = tmp_path / "home"
    work = tmp_path / "work"
    notes = home / "notes"
    ssh = home / ".ssh"
    for d in (work, notes, ssh):
        d.mkdir(parents=True)
    (ssh / "id_ed25519").write_text("PRIVATE KEY")
    (notes / "plan.md").write_text("the plan")
    (work / "main.py").write_text("print('hi')\n")
    return {"home": home, "work": work, "notes": notes, "ssh": ssh, "tmp": tmp_path}


@pytest.fixture
def broker(tree: dict[str, Path]) -> Iterator[Running]:
    settings = PolicySettings(read_paths=["~/notes"], taint_enabled=True)
    with running_broker(home=str(tree["home"]), workdir=str(tree["work"]), settings=settings,
                        socket_path=str(tree["tmp"] / "broker.sock")) as running:
        yield running


def test_a_workdir_file_is_read_through_the_broker(broker: Running) -> None:
    reply = call(broker.path, "read_file", {"path": "main.py"})
    assert reply["ok"], reply
    assert reply["result"]["content"] == "print('hi')\n"


def test_a_granted_read_succeeds_and_raises_taint_to_private(
    broker: Running, tree: dict[str, Path]
) -> None:
    reply = call(broker.path, "read_file", {"path": str(tree["notes"] / "plan.md")})
    assert reply["ok"], reply
    assert reply["result"]["content"] == "the plan"
    assert (reply["label"], reply["taint"]) == ("private", "private")


def test_a_granted_name_of_a_hidden_file_is_not_read(
    broker: Running, tree: dict[str, Path]
) -> None:
    """Issue 48 §4: a hard link in a granted folder (made by the user, or
    by anything of hers) gives ~/.ssh's key a granted name; the file has
    several names, so it is refused whichever name the grant sees."""
    os.link(tree["ssh"] / "id_ed25519", tree["notes"] / "key.md")
    reply = call(broker.path, "read_file", {"path": str(tree["notes"] / "key.md")})
    assert not reply["ok"] and "PRIVATE KEY" not in str(reply), reply
    assert "several names" in str(reply), reply


def test_a_read_outside_the_workdir_without_a_grant_is_refused(
    broker: Running, tree: dict[str, Path]
) -> None:
    reply = call(broker.path, "read_file", {"path": str(tree["ssh"] / "id_ed25519")})
    assert not reply["ok"]
    assert reply["error"]["rule"] == "hidden-path"  # built-in hidden wins (issue 19)
    assert broker.audit[-1].outcome == "deny"


def test_a_symlink_inside_a_granted_directory_cannot_escape_it(
    broker: Running, tree: dict[str, Path]
) -> None:
    (tree["notes"] / "keys").symlink_to(tree["ssh"])
    (tree["notes"] / "key").symlink_to(tree["ssh"] / "id_ed25519")
    for path in (tree["notes"] / "key", tree["notes"] / "keys" / "id_ed25519"):
        reply = call(broker.path, "read_file", {"path": str(path)})
        assert not reply["ok"], reply
        assert reply["error"]["rule"] == "real-path-not-granted"
        assert "PRIVATE KEY" not in str(reply)
    listing = call(broker.path, "list_dir", {"path": str(tree["notes"] / "keys")})
    assert not listing["ok"]
    record = broker.audit[-1]
    assert (record.outcome, record.rule, record.tool) == ("deny", "real-path-not-granted",
                                                         "list_dir")


def test_a_symlink_in_the_workdir_cannot_reach_an_ungranted_file(
    broker: Running, tree: dict[str, Path]
) -> None:
    (tree["work"] / "k").symlink_to(tree["ssh"] / "id_ed25519")
    reply = call(broker.path, "read_file", {"path": "k"})
    assert not reply["ok"] and reply["error"]["rule"] == "real-path-not-granted"


def test_swapping_a_granted_directory_for_a_symlink_between_calls_cannot_widen_a_grant(
    broker: Running, tree: dict[str, Path]
) -> None:
    sub = tree["notes"] / "sub"
    sub.mkdir()
    (sub / "id_ed25519").write_text("notes copy")
    path = str(sub / "id_ed25519")
    assert call(broker.path, "read_file", {"path": path})["result"]["content"] == "notes copy"
    (sub / "id_ed25519").unlink()
    sub.rmdir()
    sub.symlink_to(tree["ssh"])
    reply = call(broker.path, "read_file", {"path": path})
    assert not reply["ok"] and "PRIVATE KEY" not in str(reply)


def test_a_directory_swapped_back_and_forth_during_reads_never_leaks(
    broker: Running, tree: dict[str, Path]
) -> None:
    sub = tree["notes"] / "sub"
    real = tree["notes"] / "real"
    real.mkdir()
    (real / "id_ed25519").write_text("granted")
    link = tree["notes"] / "link"
    link.symlink_to(tree["ssh"])
    os.symlink(real, sub)
    stop = threading.Event()

    def swapper() -> None:
        # rename(2) swaps atomically between a link into the grant and a
        # link out of it, as fast as it can.
        tmp_in, tmp_out = tree["notes"] / ".in", tree["notes"] / ".out"
        while not stop.is_set():
            os.symlink(tree["ssh"], tmp_out)
            os.replace(tmp_out, sub)
            os.symlink(real, tmp_in)
            os.replace(tmp_in, sub)

    t = threading.Thread(target=swapper)
    t.start()
    outcomes = {"granted": 0, "refused": 0}
    client = BrokerClient(broker.path)
    try:
        for _ in range(400):
            reply = client.call("read_file", {"path": str(sub / "id_ed25519")})
            assert "PRIVATE KEY" not in str(reply)
            if reply["ok"]:
                assert reply["result"]["content"] == "granted"
                outcomes["granted"] += 1
            else:
                outcomes["refused"] += 1
    finally:
        client.close()
        stop.set()
        t.join()
    # Both sides of the race were exercised.
    assert outcomes["granted"] > 0 and outcomes["refused"] > 0, outcomes


def test_list_dir_lists_a_granted_directory(broker: Running, tree: dict[str, Path]) -> None:
    reply = call(broker.path, "list_dir", {"path": str(tree["notes"])})
    assert reply["ok"]
    assert {"name": "plan.md", "type": "file"} in reply["result"]["entries"]


def test_read_files_reads_several_and_refuses_any_ungranted(
    broker: Running, tree: dict[str, Path]
) -> None:
    ok = call(broker.path, "read_files", {"paths": ["main.py", str(tree["notes"] / "plan.md")]})
    assert [f["content"] for f in ok["result"]["files"]] == ["print('hi')\n", "the plan"]
    bad = call(broker.path, "read_files", {"paths": ["main.py", str(tree["ssh"] / "id_ed25519")]})
    assert not bad["ok"]


def test_write_and_edit_work_inside_the_workdir(broker: Running, tree: dict[str, Path]) -> None:
    assert call(broker.path, "write_file", {"path": "new.txt", "content": "one two"})["ok"]
    assert call(broker.path, "edit_file", {"path": "new.txt", "old": "two", "new": "2"})["ok"]
    assert (tree["work"] / "new.txt").read_text() == "one 2"


def test_writes_cannot_leave_the_workdir_through_a_granted_path_or_a_symlink(
    broker: Running, tree: dict[str, Path]
) -> None:
    plan = tree["notes"] / "plan.md"
    assert not call(broker.path, "write_file", {"path": str(plan), "content": "x"})["ok"]
    (tree["work"] / "out").symlink_to(tree["notes"])
    (tree["work"] / "plan.md").symlink_to(plan)
    for path in ("out/plan.md", "plan.md"):
        reply = call(broker.path, "write_file", {"path": path, "content": "owned"})
        assert not reply["ok"], reply
        reply = call(broker.path, "edit_file", {"path": path, "old": "plan", "new": "owned"})
        assert not reply["ok"], reply
    assert plan.read_text() == "the plan"


def test_a_hard_linked_file_is_not_written(broker: Running, tree: dict[str, Path]) -> None:
    outside = tree["tmp"] / "outside.txt"
    outside.write_text("keep")
    os.link(outside, tree["work"] / "hl.txt")
    assert not call(broker.path, "write_file", {"path": "hl.txt", "content": "x"})["ok"]
    assert outside.read_text() == "keep"


def test_the_agent_can_report_evictions_and_taint_recovers(
    broker: Running, tree: dict[str, Path]
) -> None:
    reply = call(broker.path, "read_file", {"path": str(tree["notes"] / "plan.md")})
    client = BrokerClient(broker.path)
    try:
        assert client.request({"op": "ledger"})["taint"] == "private"
        evicted = client.request({"op": "evict", "ids": [reply["entry"]]})
        assert evicted["dropped"] == [reply["entry"]] and evicted["taint"] == "public"
    finally:
        client.close()


def test_an_unknown_tool_is_refused_over_the_socket(broker: Running) -> None:
    reply = call(broker.path, "format_disk", {})
    assert not reply["ok"] and reply["error"]["rule"] == "unknown-tool"


def test_a_workdir_read_is_internal_even_with_a_grant_active(broker: Running) -> None:
    reply = call(broker.path, "read_file", {"path": "main.py"})
    assert (reply["label"], reply["taint"]) == ("internal", "internal")


def test_granted_data_copied_into_the_workdir_keeps_its_label(
    broker: Running, tree: dict[str, Path]
) -> None:
    secret = call(broker.path, "read_file", {"path": str(tree["notes"] / "plan.md")})
    assert call(broker.path, "write_file", {"path": "copy.md", "content": "the plan"})["ok"]
    client = BrokerClient(broker.path)
    try:
        client.request({"op": "evict", "ids": [secret["entry"]]})
        assert client.request({"op": "ledger"})["taint"] == "public"
    finally:
        client.close()
    os.rename(tree["work"] / "copy.md", tree["work"] / "renamed.md")
    again = call(broker.path, "read_file", {"path": "renamed.md"})
    assert (again["label"], again["taint"]) == ("private", "private")


def test_a_grant_over_an_agent_clis_folder_never_reads_its_login(tree: dict[str, Path]) -> None:
    """Issue 45: the fence shows placeholders in place of the CLIs' logins,
    but a grant's read outside the workdir is the host's view: a grant of
    ~/.claude read the real ~/.claude/.credentials.json through read_file,
    read_files and list_dir's neighbour. The grant's other files are read."""
    claude = tree["home"] / ".claude"
    (claude / "projects").mkdir(parents=True)
    (claude / ".credentials.json").write_text('{"claudeAiOauth": {"accessToken": "REAL"}}')
    (claude / "projects" / "s.jsonl").write_text("a session")
    settings = PolicySettings(read_paths=["~/.claude"], taint_enabled=True)
    with running_broker(home=str(tree["home"]), workdir=str(tree["work"]), settings=settings,
                        socket_path=str(tree["tmp"] / "b2.sock")) as b:
        login = str(claude / ".credentials.json")
        for tool, args in (("read_file", {"path": login}), ("read_files", {"paths": [login]})):
            reply = call(b.path, tool, args)
            assert not reply["ok"] and "REAL" not in str(reply), reply
        reply = call(b.path, "read_file", {"path": str(claude / "projects" / "s.jsonl")})
        assert reply["ok"] and reply["result"]["content"] == "a session", reply


def test_the_brokers_list_of_logins_is_the_one_the_egress_reads() -> None:
    from leviathd.hidden import CLI_LOGINS_IN_HOME
    from leviathd.proxy.loginfiles import LOGIN_FILES
    assert sorted("/".join(f.rel) for f in LOGIN_FILES) == sorted(CLI_LOGINS_IN_HOME)


def test_a_container_agents_write_tools_are_refused_in_the_hosts_view(
        tree: dict[str, Path]) -> None:
    """Issue 43 for the container kind: its container's mounts (protected
    files read-only) are not entered by the file tools, which would write in
    the host's view past them (a protected .git/config rewritten). Writes
    are refused there; reads stay within the grants."""
    settings = PolicySettings(read_paths=["~/notes"], taint_enabled=True)
    facts = {"id": "abcd1234", "user": "tester", "sandbox": "namespace+container"}
    with running_broker(home=str(tree["home"]), workdir=str(tree["work"]), settings=settings,
                        socket_path=str(tree["tmp"] / "c.sock"), agent_facts=facts) as broker:
        _container_writes_refused(broker, tree)


def _container_writes_refused(broker: Running, tree: dict[str, Path]) -> None:
    (tree["work"] / ".git").mkdir()
    (tree["work"] / ".git" / "config").write_text("[core]\n")
    for tool, args in (("write_file", {"path": ".git/config", "content": "[core]\nx=1\n"}),
                       ("edit_file", {"path": ".git/config", "old": "[core]", "new": "[x]"})):
        reply = call(broker.path, tool, args)
        assert not reply["ok"] and "container" in str(reply), reply
    assert (tree["work"] / ".git" / "config").read_text() == "[core]\n"
    assert call(broker.path, "read_file", {"path": "main.py"})["ok"]
