"""Issue 20 §5: strings an agent chooses reach a person's terminal escaped.
Each check runs `lev` on a real pty (`script`), as a person would, and
looks at the bytes the terminal got: an agent's ESC sequence (here one that
sets the window title, and one that clears the screen) must arrive as the
text `\\x1b...`, never as the ESC byte; `lev logs --raw` is the one way to
ask for the agent's output as written."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

TITLE = "\x1b]0;PWNED\x07"
CLEAR = "\x1b[2J"
CONFIG = """
[sandbox]
kind = "namespace"

[tool_permissions]
list_dir = "ask"

[taint]
approval_timeout = 30
"""


def on_pty(bed: Testbed, user: str, command: str, *, cwd: str, input: str | None = None,
           timeout: float = 60) -> str:
    """What a terminal running `command` shows (stdout and stderr)."""
    r = bed.run(["script", "-qec", command, "/dev/null"], user=user, cwd=cwd, input=input,
                check=False, timeout=timeout)
    return r.stdout + r.stderr


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    with testbed.machine_config(CONFIG):
        testbed.run(["mkdir", "-p", f"{testbed.users['alice'].home}/escw"], user="alice")
        yield testbed


def workdir(bed: Testbed) -> str:
    return f"{bed.users['alice'].home}/escw"


def test_lev_logs_escapes_the_agents_control_characters_unless_raw(bed: Testbed) -> None:
    w = workdir(bed)
    printf = shlex.quote(f"printf 'before{TITLE}{CLEAR}after\\tTAB\\n'".replace("\x1b", "\\033")
                         .replace("\x07", "\\007"))
    agent_id = bed.run(["lev", "run", "-d", "--", "sh", "-c", f"sh -c {printf}; sleep 1"],
                       user="alice", cwd=w).stdout.strip()
    deadline = time.monotonic() + 20
    while "after" not in bed.run(["lev", "logs", agent_id], user="alice").stdout:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    shown = on_pty(bed, "alice", f"lev logs {agent_id}", cwd=w)
    assert "\x1b" not in shown and "\x07" not in shown, repr(shown)
    assert "before\\x1b]0;PWNED\\x07\\x1b[2Jafter\tTAB" in shown, repr(shown)
    raw = on_pty(bed, "alice", f"lev logs --raw {agent_id}", cwd=w)
    assert f"before{TITLE}{CLEAR}after" in raw, repr(raw)


def test_the_inline_prompt_and_lev_approvals_show_an_escaped_target(bed: Testbed) -> None:
    w = workdir(bed)
    target = f"docs{TITLE}{CLEAR}"
    target_sh = target.replace("\x1b", "\\033").replace("\x07", "\\007")
    inner = (f"lev run -- sh -c \"lev tool list_dir \\\"\\$(printf '{target_sh}')\\\"; "
             "echo CALL-DONE\"")
    # On a terminal `lev run` asks inline; meanwhile `lev approvals` on another
    # terminal shows the same held call. The answer (deny) comes last.
    import subprocess
    proc = subprocess.Popen(
        bed.command(["script", "-qec", inner, "/dev/null"], user="alice", cwd=w),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        rows: list[dict[str, object]] = []
        while not rows:
            assert time.monotonic() < deadline, "no held call appeared"
            rows = json.loads(bed.run(["lev", "approvals", "--json"], user="alice").stdout)
            time.sleep(0.3)
        listed = on_pty(bed, "alice", "lev approvals", cwd=w)
        assert "\x1b" not in listed, repr(listed)
        assert "docs\\x1b]0;PWNED\\x07\\x1b[2J" in listed, repr(listed)
        assert proc.stdin is not None
        proc.stdin.write(b"d\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    shown = out.decode(errors="replace")
    assert "CALL-DONE" in shown, shown
    prompt = shown[shown.index("wants"):]
    assert "\x1b" not in prompt.split("CALL-DONE")[0], repr(prompt)
    assert "list_dir" in prompt and "\\x1b]0;PWNED\\x07\\x1b[2J" in prompt, repr(prompt)


def test_lev_ps_shows_an_agent_name_with_escapes_escaped(bed: Testbed) -> None:
    w = workdir(bed)
    name = f"evil{CLEAR}name"
    bed.run(["sh", "-c", 'printf "#!/bin/sh\\nsleep 30\\n" > "$1" && chmod +x "$1"', "-",
             f"{w}/{name}"], user="alice")
    agent_id = bed.run(["lev", "run", "-d", "--", f"./{name}"], user="alice",
                       cwd=w).stdout.strip()
    try:
        shown = on_pty(bed, "alice", "lev ps", cwd=w)
        assert agent_id in shown, shown
        assert "\x1b" not in shown, repr(shown)
        # The daemon already folds argv[0] names to the name rules (issue 23),
        # so the row shows the folded name; either way, no raw escape.
        assert "evil\\x1b[2Jname" in shown or "evil-2Jname" in shown, repr(shown)
    finally:
        bed.run(["lev", "stop", agent_id], user="alice", check=False)
