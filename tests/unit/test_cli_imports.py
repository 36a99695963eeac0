"""What `lev`'s short commands import (issue 18): their wall time is mostly
start-up, so modules they do not need must stay out. A list of modules that
must not be imported, read from `python -X importtime`; no timing asserted."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(os.environ.get("LEVIATH_IMPORTS_TREE") or Path(__file__).resolve().parents[2])

# Never on any of these paths: the event loop, the async bus library, the
# config models, what the daemon's side uses, argparse (with re, gettext,
# locale, shutil), the typing and dataclasses modules, enum (which the
# signal module's Python half imports), random (a Busy retry's jitter) and
# array (which imports collections to register itself: ~2 ms of CPU a start).
HEAVY = ("asyncio", "dbus_fast", "pydantic", "leviathd.config", "leviathd.broker",
         "leviathd.policy", "leviathd.sandbox", "leviathd.cli.client", "argparse", "re",
         "typing", "dataclasses", "pathlib", "socket", "enum", "random", "array")  # fmt: skip
# `lev tool NAME ARG...` in an agent: not even argparse, json's Python half,
# re, typing or the socket module's Python half.
TOOL_HEAVY = (*HEAVY, "json", "leviathd.errors")


def imported(
    argv: list[str], env: dict[str, str]
) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    code = "import sys; from leviathd.cli.main import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code, *argv],
        capture_output=True, text=True, env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        timeout=60, stdin=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    names = {
        line.rsplit("|", 1)[1].strip()
        for line in r.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    return names, r


def offenders(names: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == b or n.startswith(b + ".") for b in banned))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[str, list[bytes]]]:
    """A real unix socket answering one JSON line per connection."""
    path = str(tmp_path / "broker.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen()
    seen: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                seen.append(conn.makefile("rb").readline())
                conn.sendall(b'{"ok": true, "id": 1, "result": {"content": "hi \\u00e9\\n"}}\n')

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield path, seen
    srv.close()


def test_lev_tool_read_file_imports_neither_argparse_nor_json_nor_asyncio(
    broker: tuple[str, list[bytes]],
) -> None:
    path, seen = broker
    names, r = imported(["tool", "read_file", "notes/a b.txt"], {"LEVIATH_BROKER": path})
    assert r.returncode == 0, r.stderr[-2000:]
    assert offenders(names, TOOL_HEAVY) == []
    assert r.stdout == "hi é\n"
    assert [json.loads(line) for line in seen] == [
        {"op": "call", "tool": "read_file", "args": {"path": "notes/a b.txt"}, "id": 1}
    ]


@pytest.mark.parametrize("argv", [
    ["ps"], ["ps", "--all"], ["stop", "x"], ["logs", "-f", "x"],
    ["run", "--detach", "--", "true"], ["run", "--", "true"],
    ["run", "-w", "/tmp", "--", "sh", "-c", "true"],
])  # fmt: skip
def test_short_bus_commands_do_not_import_asyncio_or_dbus_fast(
    argv: list[str], tmp_path: Path
) -> None:
    # No bus at that address: the command fails after its imports are made.
    env = {"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={tmp_path}/none"}
    names, r = imported(argv, env)
    assert r.returncode != 0 and "cannot reach the system bus" in r.stderr, r.stderr[-2000:]
    assert offenders(names, HEAVY) == []


def test_lev_run_of_a_blueprint_folder_imports_neither_pathlib_nor_re(tmp_path: Path) -> None:
    (tmp_path / "bp").mkdir()
    (tmp_path / "bp" / "blueprint.toml").write_text('[agent]\nname = "x"\ncommand = ["true"]\n')
    env = {"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={tmp_path}/none"}
    names, r = imported(["run", str(tmp_path / "bp")], env)
    assert r.returncode != 0 and "cannot reach the system bus" in r.stderr, r.stderr[-2000:]
    assert offenders(names, HEAVY) == []
