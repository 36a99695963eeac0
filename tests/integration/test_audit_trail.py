"""Issue 9 §3: the audit trail cannot be forged. Any local user can send
journald an entry with `LEVIATH_AGENT=<id>` and `SYSLOG_IDENTIFIER=leviathd`;
`lev audit` and the query the docs give match only what journald stamps
(native transport, uid 0, leviathd's unit or the agent's scope). Bob forges
an "allow read_file ~/.ssh/id_ed25519" record about alice's agent with
`logger --journald`, `systemd-cat` and the journal protocol from Python;
alice forges one from inside her own agent. None shows; the real ones do."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

CONFIG = """
[sandbox]
kind = "namespace"

[tool_permissions]
web_fetch = "deny"
"""

FORGE_FIELDS = [
    "SYSLOG_IDENTIFIER=leviathd", "LEVIATH_EVENT=tool", "LEVIATH_TOOL=read_file",
    "LEVIATH_OUTCOME=allow", "LEVIATH_RULE=permission:default", "LEVIATH_TAINT=public",
    "LEVIATH_USER=alice",
]

PY_FORGE = r"""
import socket, sys
fields = dict(a.split("=", 1) for a in sys.argv[1:])
payload = "".join(f"{k}={v}\n" for k, v in fields.items()).encode()
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(payload, "/run/systemd/journal/socket")
"""


def documented_query(agent_id: str, scope: str) -> list[str]:
    """The query docs/security-model.md gives."""
    return ["journalctl", "--no-pager", "-o", "json", "_TRANSPORT=journal", "_UID=0",
            f"LEVIATH_AGENT={agent_id}", "_SYSTEMD_UNIT=leviathd.service",
            f"_SYSTEMD_UNIT={scope}"]


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    with testbed.machine_config(CONFIG):
        testbed.write_file("/tmp/forge.py", PY_FORGE)
        yield testbed


def test_forged_entries_never_show_in_lev_audit_or_the_documented_query(bed: Testbed) -> None:
    home = bed.users["alice"].home
    work = f"{home}/auditw"
    bed.run(f"mkdir -p {work} && echo hello > {work}/a.txt", user="alice")
    inside_forge = "logger --journald <<EOF\n" + "\n".join(
        ["MESSAGE=FORGED-INSIDE", "LEVIATH_AGENT=$LEV_ID", "LEVIATH_TARGET=/inside",
         *FORGE_FIELDS]) + "\nEOF\n"
    script = (
        "lev tool read_file a.txt >/dev/null; lev tool web_fetch http://localhost:1/ ; "
        "while [ ! -f go ]; do sleep 0.1; done; LEV_ID=$(cat go); " + inside_forge +
        "touch forged; while [ ! -f end ]; do sleep 0.1; done"
    )
    bed.run(["rm", "-f", f"{work}/go", f"{work}/end", f"{work}/forged"])
    agent_id = bed.run(["lev", "run", "-d", "--", "sh", "-c", script], user="alice",
                       cwd=work).stdout.strip()
    scope = f"leviath-alice-sh-{agent_id}.scope"
    try:
        target = f"{home}/.ssh/id_ed25519"
        forged = [f"LEVIATH_AGENT={agent_id}", f"LEVIATH_TARGET={target}", *FORGE_FIELDS]
        # bob, from his shell: the journal protocol three ways.
        bed.run(["logger", "--journald"], user="bob",
                input="\n".join(["MESSAGE=FORGED-LOGGER", *forged]) + "\n")
        bed.run(["/opt/leviath-dev/venv/bin/python", "/tmp/forge.py",
                 "MESSAGE=FORGED-PY", *forged], user="bob")
        bed.run(["systemd-cat", "-t", "leviathd", "echo",
                 f"FORGED-CAT LEVIATH_AGENT={agent_id}"], user="bob")
        # alice, from her shell and from inside her agent.
        bed.run(["logger", "--journald"], user="alice",
                input="\n".join(["MESSAGE=FORGED-ALICE", *forged]) + "\n")
        bed.run(["sh", "-c", f"echo {agent_id} > go"], user="alice", cwd=work)
        bed.run(["sh", "-c", f"until [ -f {work}/forged ]; do sleep 0.1; done"], timeout=30)

        # The forgeries from the host did land in the journal: the old query
        # shows them. (Inside the namespace fence the journal socket is not
        # reachable; whatever the agent managed, it must not show either.)
        deadline = time.monotonic() + 15
        while True:
            naive = bed.run(["journalctl", "--no-pager", f"LEVIATH_AGENT={agent_id}"]).stdout
            if all(f in naive for f in ("FORGED-LOGGER", "FORGED-PY", "FORGED-ALICE")):
                break
            assert time.monotonic() < deadline, naive
            time.sleep(0.3)

        shown = ""
        deadline = time.monotonic() + 15
        while "web_fetch" not in shown:
            assert time.monotonic() < deadline, shown
            time.sleep(0.3)
            shown = bed.run(["lev", "audit", agent_id], user="alice").stdout
        assert "FORGED" not in shown and "id_ed25519" not in shown, shown
        lines = shown.splitlines()
        read = next(x for x in lines if " read_file " in x)
        assert f"{work}/a.txt" in read and " allow " in read and "taint public" in read, read
        denied = next(x for x in lines if " web_fetch " in x)
        assert " deny " in denied and "permission" in denied, denied
        assert any("[start]" in x for x in lines), lines

        as_json = [json.loads(x) for x in
                   bed.run(["lev", "audit", "--json", agent_id], user="alice").stdout.splitlines()]
        assert all("FORGED" not in json.dumps(r) for r in as_json)
        tool = next(r for r in as_json if r["event"] == "tool" and r["tool"] == "read_file")
        assert tool["decision"] == "allow" and tool["taint_before"] and tool["taint_after"]

        deadline = time.monotonic() + 30  # journald may be behind: waited for
        while "web_fetch" not in (documented := bed.run(documented_query(agent_id, scope)).stdout):
            assert time.monotonic() < deadline, documented[-2000:]
            time.sleep(0.3)
        assert "FORGED" not in documented and "id_ed25519" not in documented
        assert "web_fetch" in documented

        # Another user's agent does not exist for bob; the admin sees it.
        r = bed.run(["lev", "audit", agent_id], user="bob", check=False)
        assert r.returncode != 0 and "no agent" in r.stderr, r
        assert "web_fetch" in bed.run(["lev", "audit", agent_id], user="dave").stdout
    finally:
        bed.run(["touch", f"{work}/end"], user="alice")
        bed.run(["lev", "stop", agent_id], user="alice", check=False)


def test_lev_audit_follow_prints_as_it_happens_and_returns_at_the_end(bed: Testbed) -> None:
    import subprocess

    work = f"{bed.users['alice'].home}/auditf"
    bed.run(f"mkdir -p {work} && rm -f {work}/go && echo x > {work}/b.txt", user="alice")
    agent_id = bed.run(
        ["lev", "run", "-d", "--", "sh", "-c",
         "while [ ! -f go ]; do sleep 0.1; done; lev tool read_file b.txt >/dev/null"],
        user="alice", cwd=work).stdout.strip()
    proc = subprocess.Popen(bed.command(["lev", "audit", "--follow", agent_id], user="alice"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1)
        bed.run(["touch", f"{work}/go"], user="alice")
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert " read_file " in out and "[end]" in out, out
