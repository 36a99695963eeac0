"""Issue 48 §4 (rules hold for every name of the file; a blueprint tool's
path argument is decided in the agent's view) from inside real agents
(namespace fence, attached `lev run` of a blueprint whose command is the
probe script; the bed's machine config holds `.pem` rules).

- A hard link the agent makes in its workdir (`ln keys/server.pem hard.txt`)
  gives a key file in a folder it cannot write (so cannot rename it from)
  a name no rule names: read_file, read_files and a
  blueprint tool's path argument read it under the name `hard.txt`
  (before: FACTKEY came back every time; seen failing). Now a regular file
  with more than one name is refused on the opened descriptor's link count.
- In a throwaway workdir the agent's layer is what its tool reads: a host
  file `harmless.txt` replaced in the layer by a link to server.pem (soft or
  hard) is judged as server.pem, or refused for its several names.
- A hard link from the workdir to a key outside it cannot be made in the
  fence (another mount: EXDEV; the home is scratch): probed, and if it ever
  could, its reads are refused as above.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator

import pytest
from loop_agent import lay_out
from testbed import Testbed

pytestmark = pytest.mark.testbed

KEY = "-----BEGIN PRIVATE KEY-----\nFACTKEY\n"

BLUEPRINT = """
[agent]
name = "links"
command = ["sh", ".probe.sh"]

[tools.show]
description = "print a file"
argv = ["cat", "--", "{file}"]

[tools.show.arguments]
required = ["file"]

[tools.show.arguments.properties.file]
type = "string"
format = "path"
"""

CONFIG = """
[sandbox]
kind = "namespace"

[tool_permissions]
read_file = "allow"
read_files = "allow"

[[rules]]
name = "no-pem-read"
when = 'call.kind == "read" && call.target.endsWith(".pem")'
decision = "deny"
reason = "key files stay on the host"

[[rules]]
name = "no-pem-path"
when = 'call.tool == "show" && size(call.paths) > 0 && call.paths[0].endsWith(".pem")'
decision = "deny"
reason = "key files stay on the host, whichever tool reads"
"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    lay_out(bed, "lk", "lkbp", BLUEPRINT, {
        "lk/keys/server.pem": KEY,
        "lk/small.txt": "small\n",
        "lk/harmless.txt": "harmless\n",
        "lkout/outside.pem": KEY,
    })
    home = bed.users["alice"].home
    # Alice's key in a folder she cannot write: the agent cannot rename it
    # to a name no rule names, but it may give it another name (her file).
    bed.run(["chown", "root:root", f"{home}/lk/keys"])
    bed.run(["chmod", "755", f"{home}/lk/keys"])
    old_config = bed.run(["cat", "/etc/leviath/config.toml"], check=False).stdout
    bed.write_file("/etc/leviath/config.toml", CONFIG)
    bed.run(["systemctl", "restart", "leviathd"])
    yield bed
    bed.write_file("/etc/leviath/config.toml", old_config)
    bed.run(["systemctl", "restart", "leviathd"])
    bed.run(["rm", "-rf", f"{home}/lk", f"{home}/lkbp", f"{home}/lkout"], check=False)


def _tool(label: str, *argv: str) -> str:
    """A probe line: `label RC MESSAGE` for one `lev tool` call."""
    words = " ".join(shlex.quote(a) for a in argv)
    return (f"out=$(lev tool {words} 2>&1); rc=$?; "
            f"printf '%s %s %s\\n' {label} $rc \"$(printf %s \"$out\" | tr '\\n' ' ' "
            "| head -c 400)\"\n")


def _sh(label: str, command: str) -> str:
    return (f"out=$( ({command}) 2>&1); rc=$?; "
            f"printf '%s %s %s\\n' {label} $rc \"$(printf %s \"$out\" | tr '\\n' ' ' "
            "| head -c 400)\"\n")


def _probe(bed: Testbed, script: str, *run_args: str) -> dict[str, tuple[int, str]]:
    home = bed.users["alice"].home
    bed.run(["sh", "-c", 'cat > "$1"', "probe", f"{home}/lk/.probe.sh"], user="alice",
            input=script)
    r = bed.run(["lev", "run", *run_args, f"{home}/lkbp"], user="alice", cwd=f"{home}/lk",
                timeout=120)
    out: dict[str, tuple[int, str]] = {}
    for line in r.stdout.splitlines():
        label, _, rest = line.partition(" ")
        rc, _, message = rest.partition(" ")
        if rc.isdigit():
            out[label] = (int(rc), message)
    return out


def _refused(probes: dict[str, tuple[int, str]], label: str, why: str = "") -> None:
    assert label in probes, probes
    rc, message = probes[label]
    assert rc != 0 and "FACTKEY" not in message, f"{label}: read: {message}"
    assert why in message, f"{label}: {message}"


def _ok(probes: dict[str, tuple[int, str]], label: str) -> str:
    assert label in probes, probes
    rc, message = probes[label]
    assert rc == 0, f"{label}: {message}"
    return message


def test_a_hard_link_made_in_the_workdir_beats_no_rule(bed: Testbed) -> None:
    home = bed.users["alice"].home
    script = "".join([
        _sh("mv", "mv keys/server.pem moved.txt"),
        _sh("ln", "rm -f hard.txt && ln keys/server.pem hard.txt"),
        _tool("r:hard", "read_file", "hard.txt"),
        _tool("rs:hard", "read_files", "small.txt", "hard.txt"),
        _tool("bp:hard", "show", "hard.txt"),
        _sh("ln:out", f"ln {home}/lkout/outside.pem out.txt"),
        _tool("r:out", "read_file", "out.txt"),
        _tool("r:small", "read_file", "small.txt"),
        _tool("bp:small", "show", "small.txt"),
    ])
    probes = _probe(bed, script)
    assert probes["mv"][0] != 0, probes
    _ok(probes, "ln")
    _refused(probes, "r:hard", "several names")
    _refused(probes, "rs:hard", "several names")
    _refused(probes, "bp:hard", "several names")
    # The fence offers no name of a file outside the workdir to link to.
    assert probes["ln:out"][0] != 0, probes
    _refused(probes, "r:out")
    assert "small" in _ok(probes, "r:small")
    assert "small" in _ok(probes, "bp:small")
    # The host's tree: only the link the agent made (rw workdir).
    assert bed.read_file(f"{home}/lk/keys/server.pem") == KEY
    bed.run(["rm", "-f", f"{home}/lk/hard.txt"], user="alice")


def test_a_throwaway_layers_file_is_what_the_tool_is_judged_on(bed: Testbed) -> None:
    home = bed.users["alice"].home
    script = "".join([
        _sh("soft", "rm harmless.txt && ln -s keys/server.pem harmless.txt"),
        _tool("bp:soft", "show", "harmless.txt"),
        _tool("r:soft", "read_file", "harmless.txt"),
        _sh("hard", "ln keys/server.pem layer.txt"),
        _tool("bp:hard", "show", "layer.txt"),
        _tool("r:hard", "read_file", "layer.txt"),
        _sh("new", "echo fine > new.txt"),
        _tool("bp:new", "show", "new.txt"),
    ])
    probes = _probe(bed, script, "--workdir-mode", "throwaway")
    _ok(probes, "soft")
    _refused(probes, "bp:soft", "rule:machine:no-pem-path")
    _refused(probes, "r:soft", "rule:machine:no-pem-read")
    _ok(probes, "hard")
    _refused(probes, "bp:hard", "several names")
    _refused(probes, "r:hard", "several names")
    # A file only the layer has is read there, as the tool reads it.
    assert "fine" in _ok(probes, "bp:new")
    # The host's files are as they were.
    assert bed.read_file(f"{home}/lk/harmless.txt") == "harmless\n"
    assert bed.run(["test", "-e", f"{home}/lk/layer.txt"], check=False).returncode != 0
