"""Held calls, the credential tool, the shell hook and the audit trail,
through a real broker socket."""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from broker_harness import AGENT, Running, call, direct_credential, running_broker

from leviathd.broker.tools import ShellRequest
from leviathd.domain.credentials import CredentialSpec
from leviathd.policy.approvals import Answer
from leviathd.policy.settings import PolicySettings


def _dirs(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "f.txt").write_text("data")
    return str(tmp_path / "home"), str(tmp_path / "work")


def _wait_for_request(b: Running, n: int = 1) -> str:
    deadline = time.monotonic() + 5
    while len(b.asked) < n:
        assert time.monotonic() < deadline, "no approval request appeared"
        time.sleep(0.01)
    return b.asked[n - 1].id


@pytest.mark.parametrize(("answer", "ok"), [(Answer.ONCE, True), (Answer.DENY, False)])
def test_an_asked_tool_waits_for_its_owner(tmp_path: Path, answer: Answer, ok: bool) -> None:
    home, work = _dirs(tmp_path)
    settings = PolicySettings(permissions={"read_file": "ask"})
    with running_broker(home=home, workdir=work, settings=settings,
                        socket_path=str(tmp_path / "b.sock")) as b, ThreadPoolExecutor() as ex:
        pending = ex.submit(call, b.path, "read_file", {"path": "f.txt"})
        rid = _wait_for_request(b)
        time.sleep(0.05)
        assert not pending.done()  # held until somebody answers
        b.run(lambda: b.broker.approvals.answer(rid, answer, by_uid=b.broker.user.uid))
        reply = pending.result(5)
        assert reply["ok"] is ok
        assert [r.outcome for r in b.audit] == ["ask", "allow" if ok else "deny"]


def test_an_asked_read_gives_the_file_as_it_is_after_the_answer(tmp_path: Path) -> None:
    """Issue 47: a read_file is read with the open that resolves it, before
    the gate decides; one that waits for a person is read again after the
    answer, never handed what the file held before it was allowed."""
    home, work = _dirs(tmp_path)
    settings = PolicySettings(permissions={"read_file": "ask"})
    with running_broker(home=home, workdir=work, settings=settings,
                        socket_path=str(tmp_path / "b.sock")) as b, ThreadPoolExecutor() as ex:
        pending = ex.submit(call, b.path, "read_file", {"path": "f.txt"})
        rid = _wait_for_request(b)
        (Path(work) / "f.txt").write_text("after the answer")
        b.run(lambda: b.broker.approvals.answer(rid, Answer.ONCE, by_uid=b.broker.user.uid))
        reply = pending.result(5)
        assert reply["ok"], reply
        assert reply["result"]["content"] == "after the answer", reply


def test_an_asked_tool_is_refused_after_the_timeout(tmp_path: Path) -> None:
    home, work = _dirs(tmp_path)
    settings = PolicySettings(permissions={"read_file": "ask"}, approval_timeout=0.2)
    with running_broker(home=home, workdir=work, settings=settings,
                        socket_path=str(tmp_path / "b.sock")) as b:
        reply = call(b.path, "read_file", {"path": "f.txt"})
        assert not reply["ok"]
        assert "refused-by-person-or-timeout" in reply["error"]["rule"]


def test_a_session_answer_is_not_asked_again(tmp_path: Path) -> None:
    home, work = _dirs(tmp_path)
    settings = PolicySettings(permissions={"read_file": "ask"})
    with running_broker(home=home, workdir=work, settings=settings,
                        socket_path=str(tmp_path / "b.sock")) as b, ThreadPoolExecutor() as ex:
        pending = ex.submit(call, b.path, "read_file", {"path": "f.txt"})
        rid = _wait_for_request(b)
        b.run(lambda: b.broker.approvals.answer(rid, Answer.SESSION, by_uid=b.broker.user.uid))
        assert pending.result(5)["ok"]
        assert call(b.path, "read_file", {"path": "f.txt"})["ok"]
        assert len(b.asked) == 1


def test_every_decision_is_an_audit_record_with_the_agreed_fields(tmp_path: Path) -> None:
    home, work = _dirs(tmp_path)
    with running_broker(home=home, workdir=work, settings=PolicySettings(),
                        socket_path=str(tmp_path / "b.sock")) as b:
        call(b.path, "read_file", {"path": "f.txt"})
        call(b.path, "read_file", {"path": "/etc/passwd"})
    allow, deny = b.audit
    assert (allow.outcome, deny.outcome) == ("allow", "deny")
    fields = deny.journal_fields()
    assert fields["LEVIATH_AGENT"] == AGENT
    for key in ("USER", "TOOL", "TARGET", "TAINT", "CLEARANCE", "RULE", "OUTCOME"):
        assert f"LEVIATH_{key}" in fields
    assert fields["LEVIATH_TARGET"] == "/etc/passwd"


def test_the_credential_tool_hides_the_secret_and_labels_output_private(
    tmp_path: Path,
) -> None:
    home, work = _dirs(tmp_path)
    secret_file = tmp_path / "token"
    secret_file.write_text("s3cr3t-t0ken\n")
    spec = CredentialSpec(("/bin/sh", "-c", 'read -r t; echo "auth=$t for $0"; env', "x"),
                          str(secret_file))
    retired = CredentialSpec(("/bin/sh", "-c", 'echo "auth=$API_TOKEN"'), str(secret_file),
                             "API_TOKEN")
    settings = PolicySettings(credentials={"api": spec, "old": retired})
    with running_broker(home=home, workdir=work, settings=settings,
                        socket_path=str(tmp_path / "b.sock"), credential=direct_credential) as b:
        assert call(b.path, "credential", {"name": "nope"})["error"]["code"] == "failed"
        # A credential that still asks for the secret in a variable is refused.
        reply = call(b.path, "credential", {"name": "old"})
        assert not reply["ok"] and "standard input" in reply["error"]["message"], reply
        assert "s3cr3t" not in str(reply)
        reply = call(b.path, "credential", {"name": "api", "args": []})
        assert reply["ok"], reply
        out = reply["result"]["stdout"]
        assert "auth=[redacted] for x" in out
        assert "s3cr3t" not in str(reply)
        assert reply["label"] == "private" and reply["taint"] == "private"


def test_without_the_daemons_fence_a_credential_command_does_not_run(tmp_path: Path) -> None:
    home, work = _dirs(tmp_path)
    secret_file = tmp_path / "token"
    secret_file.write_text("s3cr3t-t0ken\n")
    mark = tmp_path / "ran"
    spec = CredentialSpec(("/bin/sh", "-c", f"touch {mark}"), str(secret_file))
    settings = PolicySettings(credentials={"api": spec})
    with running_broker(home=home, workdir=work, settings=settings,
                        socket_path=str(tmp_path / "b.sock")) as b:
        reply = call(b.path, "credential", {"name": "api"})
        assert not reply["ok"] and "fence" in reply["error"]["message"]
    assert not mark.exists()


def test_a_credential_secret_can_come_from_a_command_whose_failure_shows_no_output(
    tmp_path: Path,
) -> None:
    home, work = _dirs(tmp_path)
    ok = CredentialSpec(("/bin/sh", "-c", 'read -r t; echo "auth=$t"'), "",
                        secret_command=("/bin/echo", "from-cmd-s3cret"))
    bad = CredentialSpec(("/bin/true",), "",
                         secret_command=("/bin/sh", "-c", "echo leaked-s3cret; exit 3"))
    # Taint off: the first call's Private output would hold the second.
    settings = PolicySettings(credentials={"ok": ok, "bad": bad}, taint_enabled=False)
    with running_broker(home=home, workdir=work, settings=settings,
                        socket_path=str(tmp_path / "b.sock"), credential=direct_credential) as b:
        reply = call(b.path, "credential", {"name": "ok"})
        assert reply["ok"], reply
        assert reply["result"]["stdout"] == "auth=[redacted]\n"
        reply = call(b.path, "credential", {"name": "bad"})
        assert not reply["ok"] and "status 3" in reply["error"]["message"]
        assert "leaked" not in str(reply)


def test_shell_runs_through_the_daemons_runner(tmp_path: Path) -> None:
    home, work = _dirs(tmp_path)
    seen: list[ShellRequest] = []

    async def runner(req: ShellRequest) -> Mapping[str, Any]:
        seen.append(req)
        return {"exit_status": 0, "stdout": "ran", "stderr": ""}

    with running_broker(home=home, workdir=work, settings=PolicySettings(),
                        socket_path=str(tmp_path / "b.sock"), shell=runner) as b:
        reply = call(b.path, "shell", {"command": "ls -l"})
    assert reply["result"]["stdout"] == "ran"
    assert seen == [ShellRequest(AGENT, "ls -l", None)]


def test_shell_without_a_runner_is_unavailable_not_run(tmp_path: Path) -> None:
    home, work = _dirs(tmp_path)
    with running_broker(home=home, workdir=work, settings=PolicySettings(),
                        socket_path=str(tmp_path / "b.sock")) as b:
        assert not call(b.path, "shell", {"command": "ls"})["ok"]


def test_bad_arguments_are_refused_before_the_gate(tmp_path: Path) -> None:
    home, work = _dirs(tmp_path)
    with running_broker(home=home, workdir=work, settings=PolicySettings(),
                        socket_path=str(tmp_path / "b.sock")) as b:
        reply = call(b.path, "read_file", {"path": 3})
        assert reply["error"]["code"] == "invalid"
        assert call(b.path, "read_file", {"path": "f.txt", "evil": 1})["error"]["code"] == "invalid"


def test_a_killed_opener_is_replaced_on_the_next_call(tmp_path: Path) -> None:
    import os
    import signal

    home, work = _dirs(tmp_path)
    with running_broker(home=home, workdir=work, settings=PolicySettings(),
                        socket_path=str(tmp_path / "b.sock")) as b:
        assert call(b.path, "read_file", {"path": "f.txt"})["ok"]
        opener = b.broker._opener
        assert opener is not None
        os.kill(opener.pid, signal.SIGKILL)
        os.waitpid(opener.pid, 0)
        assert call(b.path, "read_file", {"path": "f.txt"})["ok"]
        assert b.broker._opener is not None and b.broker._opener.pid != opener.pid
