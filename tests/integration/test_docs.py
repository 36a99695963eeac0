"""The commands the docs print run as printed: every `$ ...` line of the
```console blocks of README.md, docs/*.md and examples/README.md runs in the
test bed, as alice, in `~/src/app`, and must exit 0; a `# ...` line runs as
root. A line ending in a backslash goes on on the next.

State the docs take for granted is set up here, before each block:
- the example blueprints (examples/, installed where the packages put them)
  are in alice's store, except those the block installs itself with `lev add`;
  tests/fixtures/blueprints/cto (the seed's example) too, for configuration.md;
- `~/src/app` holds a Makefile whose `test` target passes, `~/src/docs` a note;
- a detached `reviewer` runs; the docs' example id `5e1f0a2c` stands for its
  id, or for the id the block's own last `lev run --detach` printed.

A block that cannot run here is marked on the line before its fence with
`<!-- docs-test: skip REASON -->` (invisible when rendered); such blocks are
listed in NOT_RUNNABLE, so a new mark is a deliberate change of this file."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from testbed import Testbed
from testbed.project import EXAMPLES_DIR

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "examples/README.md"]
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s+(.+?)\s*-->")
EXAMPLE_ID = "5e1f0a2c"
STORE = ".local/share/leviath/agents"
PREINSTALLED = {
    "reviewer": f"{EXAMPLES_DIR}/reviewer",
    "builder": f"{EXAMPLES_DIR}/builder",
    "cto": "/usr/share/leviath-test/cto",
}
MAKEFILE = "test:\n\techo tests pass\n"


@dataclass
class Block:
    where: str
    commands: list[tuple[str | None, str]]  # (user, command line); None is root
    skip: str | None


def blocks() -> list[Block]:
    found = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != "```console":
                continue
            marker = SKIP.search(lines[i - 1]) if i else None
            commands: list[tuple[str | None, str]] = []
            going_on = False
            for body in lines[i + 1:]:
                if body.startswith("```"):
                    break
                if going_on:
                    user, line = commands[-1]
                    commands[-1] = (user, line + "\n" + body)
                elif body.startswith(("$ ", "# ")):
                    commands.append(("alice" if body[0] == "$" else None, body[2:]))
                else:
                    continue
                going_on = body.endswith("\\")
            found.append(Block(f"{doc.relative_to(REPO)}:{i + 1}", commands,
                               marker.group(1) if marker else None))
    return found


def test_every_doc_has_its_blocks_found() -> None:
    where = {b.where.split(":")[0] for b in blocks()}
    assert {"README.md", "docs/cli.md", "docs/configuration.md"} <= where
    empty = [b.where for b in blocks() if not b.commands]
    assert not empty, f"console blocks without a `$ ` or `# ` line: {empty}"


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    home = testbed.users["alice"].home
    testbed.copy_in(REPO / "tests/fixtures/blueprints", "/usr/share/leviath-test")
    testbed.run(["chmod", "-R", "a+rX", "/usr/share/leviath-test"])
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.run(["mkdir", "-p", f"{home}/src/app", f"{home}/src/docs"], user="alice")
    testbed.run(f"cat > {home}/src/app/Makefile", user="alice", input=MAKEFILE)
    testbed.run(f"echo notes > {home}/src/docs/design.md", user="alice")
    yield testbed
    testbed.run(["rm", "-rf", *(f"{home}/{STORE}/{name}" for name in PREINSTALLED)],
                user="alice")


def _prepare(bed: Testbed, block: Block) -> str:
    """Alice's store as the block expects it; the id of a running reviewer."""
    home = bed.users["alice"].home
    bed.run(["rm", "-rf", *(f"{home}/{STORE}/{name}" for name in PREINSTALLED)], user="alice")
    added = " ".join(c for _u, c in block.commands if c.startswith("lev add "))
    for path in PREINSTALLED.values():
        if path not in added:
            bed.run(["lev", "add", path], user="alice")
    # By path: the block may be the one that installs it.
    r = bed.run(["lev", "run", "--detach", PREINSTALLED["reviewer"], "--workdir",
                 f"{home}/src/app"], user="alice")
    return r.stdout.strip()


# Blocks marked not runnable, by where they are: a new mark must be added here
# on purpose (a skipped test would read as a pass, so marked blocks are left
# out of the runs below and listed instead).
NOT_RUNNABLE = {"docs/testing.md"}


def test_only_the_known_blocks_are_marked_not_runnable() -> None:
    marked = {b.where.split(":")[0] for b in blocks() if b.skip}
    assert marked == NOT_RUNNABLE, marked


@pytest.mark.parametrize("block", [b for b in blocks() if not b.skip], ids=lambda b: b.where)
def test_console_block_runs_as_printed(bed: Testbed, block: Block) -> None:
    home = bed.users["alice"].home
    agent_id = _prepare(bed, block)
    for user, command in block.commands:
        line = command.replace(EXAMPLE_ID, agent_id)
        r = bed.run(line, user=user, cwd=f"{home}/src/app", check=False, timeout=120)
        assert r.returncode == 0, (
            f"{block.where}: `$ {command}` (ran as `{line}`) exited {r.returncode}\n"
            f"stdout: {r.stdout}\nstderr: {r.stderr}"
        )
        if re.match(r"lev run (.* )?(--detach|-d)\b", line):
            agent_id = r.stdout.strip().splitlines()[-1]
