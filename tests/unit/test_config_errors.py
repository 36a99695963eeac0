"""Bad config gets one clear line per problem: file, line, dotted key, what is wrong.
Never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from leviathd.config.load import load_blueprint, load_config, parse_blueprint, parse_config
from leviathd.errors import ConfigError, NotFound

SRC = "/etc/leviath/config.toml"

CONFIG_CASES = [
    (
        '[sandbox]\nkind = "vm"\n',
        f"{SRC}:2: sandbox.kind: must be 'none', 'namespace' or 'container', not 'vm'",
    ),
    (
        '# comment\n[sandbox]\nnetwork = false\nkidn = "none"\n',
        f"{SRC}:4: sandbox.kidn: unknown key (did you mean 'kind'?)",
    ),
    ('[sandboxx]\nkind = "none"\n', f"{SRC}:1: sandboxx: unknown key (did you mean 'sandbox'?)"),
    ("[sandbox]\nkind = \n", f"{SRC}:2: not valid TOML: invalid value"),
    ("[sandbox\n", f"{SRC}:1: not valid TOML: "),
    (
        '[resources]\nmemory_max = "2X"\n',
        f'{SRC}:2: resources.memory_max: must be a size in bytes such as 536870912, "512M" or "2G"',
    ),
    (
        '[resources]\ncpu_quota = "150"\n',
        f'{SRC}:2: resources.cpu_quota: must be a percentage of one CPU such as "150%"',
    ),
    (
        '[[allowlist]]\ntool = "http_post"\ntarget = "a"\nmax_sensitivity = "public"\n'
        '[[allowlist]]\ntool = "http_post"\ntarget = "b"\nmax_sensitivity = "secret"\n',
        f"{SRC}:8: allowlist[1].max_sensitivity: must be 'public', 'internal' or 'private', "
        "not 'secret'",
    ),
    (
        '[[allowlist]]\ntool = "http_post"\ntarget = "b"\n',
        f"{SRC}:1: allowlist[0].max_sensitivity: required key is missing",
    ),
    (
        '[sandbox]\nmounts = [{ path = "relative/dir", access = "write" }]\n',
        f"{SRC}:2: sandbox.mounts[0].path: must be an absolute path or start with ~/, "
        "not 'relative/dir'",
    ),
    (
        '[sandbox]\nmounts = [{ path = "/srv", access = "all" }]\n',
        f"{SRC}:2: sandbox.mounts[0].access: must be 'read' or 'write', not 'all'",
    ),
    (
        '[security]\nread_paths = ["~/ok", "regex:.*"]\n',
        f"{SRC}:2: security.read_paths[1]: 'regex:.*': a regex must be absolute",
    ),
    (
        '[agent_read_paths.cto]\nallow = ["glob:/**"]\n',
        f"{SRC}:2: agent_read_paths.cto.allow[0]: 'glob:/**': matches the whole file system",
    ),
    (
        '[tool_permissions]\nshell = "maybe"\n',
        f"{SRC}:2: tool_permissions.shell: must be 'allow', 'ask' or 'deny', not 'maybe'",
    ),
    ("[taint]\nbudget = 0\n", f"{SRC}:2: taint.budget: input should be greater than or equal to 1"),
    ('[sandbox]\nnetwork = "no"\n', f'{SRC}:2: sandbox.network: must be true, false or "proxy"'),
    ('[sandbox]\nscratch_dir = "tmp"\n', f"{SRC}:2: sandbox.scratch_dir: must be an absolute path"),
    ('[sandbox]\nmounts = "~/x"\n', f"{SRC}:2: sandbox.mounts: must be an array"),
    ("sandbox = 3\n", f"{SRC}:1: sandbox: must be a table"),
    ('sandbox.kind = "x"\n', f"{SRC}:1: sandbox.kind: must be 'none'"),
    (
        '[credentials.gh]\ncommand = ["gh"]\nenv = "X"\n',
        f"{SRC}:1: credentials.gh: set exactly one of secret_file or secret_command",
    ),
    (
        '[credentials.gh]\ncommand = []\nsecret_file = "/k"\nenv = "X"\n',
        f"{SRC}:2: credentials.gh.command: must be a non-empty list of strings (an argv)",
    ),
    (
        '[security]\nenv_pass = ["NOT A NAME"]\n',
        f"{SRC}:2: security.env_pass[0]: 'NOT A NAME' is not an environment variable name "
        "or pattern (like LC_*)",
    ),
    (
        '[security]\nhidden_paths = ["~/a/../b"]\n',
        f"{SRC}:2: security.hidden_paths[0]: may not contain '.' or '..' components",
    ),
]


@pytest.mark.parametrize(("text", "message"), CONFIG_CASES)
def test_a_bad_config_names_the_file_the_line_the_key_and_what_is_wrong(
    text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, SRC)
    assert str(info.value).startswith(message), str(info.value)


BP = "agents/cto/blueprint.toml"

BLUEPRINT_CASES = [
    ('[agent]\nversion = "1"\ncommand = ["x"]\n', f"{BP}:1: agent.name: required key is missing"),
    ('[stages.a]\ncommand = ["x"]\n', f"{BP}: agent: required table is missing"),
    (
        '[agent]\nname = "x"\n\n[stages.a]\ndescription = "d"\n',
        f"{BP}:4: stages.a.command: required key is missing",
    ),
    (
        '[agent]\nname = "x"\ncommand = ["x"]\n[stages.a]\ncommand = ["y"]\n'
        '[stages.a.sandbox]\nkind = "vm"\n',
        f"{BP}:7: stages.a.sandbox.kind: must be 'none', 'namespace' or 'container', not 'vm'",
    ),
    (
        '[agent]\nname = "bad name"\ncommand = ["x"]\n',
        f"{BP}:2: agent.name: 'bad name' is not a valid name",
    ),
    (
        '[agent]\nname = "x"\ncommand = ["x"]\nversion = 1.0\n',
        f"{BP}:4: agent.version: input should be a valid string",
    ),
    (
        '[agent]\nname = "x"\ncommand = ["x"]\n[read_paths]\nallow = ["regex:.*"]\n',
        f"{BP}:5: read_paths.allow[0]: 'regex:.*': a regex must be absolute",
    ),
    (
        '[agent]\nname = "x"\ncommand = ["x"]\n[read_paths]\nalow = ["~/a"]\n',
        f"{BP}:5: read_paths.alow: unknown key (did you mean 'allow'?)",
    ),
    (
        '[agent]\nname = "x"\ncommand = ["x"]\n[permissions]\nshell = "never"\n',
        f"{BP}:5: permissions.shell: must be 'allow', 'ask' or 'deny', not 'never'",
    ),
    (
        '[agent]\nname = "x"\ncommand = ["x"]\n[env]\n"1X" = "y"\n',
        f"{BP}:4: env: '1X' is not a valid environment variable name",
    ),
    (
        '[agent]\nname = "x"\ncommand = ["x"]\n[seed]\ncommands = [[]]\n',
        f"{BP}:5: seed.commands[0]: must be a non-empty list of strings",
    ),
    (
        '[agent]\nname = "x"\ncommand = ["x"]\n[sandbox]\nengine = "lxc"\n',
        f"{BP}:5: sandbox.engine: must be 'auto', 'podman' or 'docker', not 'lxc'",
    ),
]


@pytest.mark.parametrize(("text", "message"), BLUEPRINT_CASES)
def test_a_bad_blueprint_names_the_file_the_line_the_key_and_what_is_wrong(
    text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_blueprint(text, BP)
    assert str(info.value).startswith(message), str(info.value)


def test_every_problem_in_a_file_is_reported_one_per_line() -> None:
    text = '[sandbox]\nkind = "vm"\nnetwork = "x"\n[resources]\ncpu_weight = 0\n'
    with pytest.raises(ConfigError) as info:
        parse_config(text, SRC)
    lines = str(info.value).splitlines()
    assert [line.split(": ")[0:2] for line in lines] == [
        [f"{SRC}:2", "sandbox.kind"],
        [f"{SRC}:3", "sandbox.network"],
        [f"{SRC}:5", "resources.cpu_weight"],
    ]


def test_unreadable_and_non_utf8_files_are_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "config.toml"
    bad.write_bytes(b'[sandbox]\nimage = "\xff"\n')
    with pytest.raises(ConfigError, match=r"config.toml:2: not valid UTF-8"):
        load_config(bad)
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
    with pytest.raises(NotFound, match="no such blueprint"):
        load_blueprint(tmp_path / "nothing")


def test_the_lev_command_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    bp = tmp_path / "bp"
    bp.mkdir()
    (bp / "blueprint.toml").write_text(
        '[agent]\nname = "x"\ncommand = ["x"]\n[sandbox]\nkind = 3\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "leviathd.cli.main", "validate", str(bp)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "LEVIATH_CONFIG": str(tmp_path / "none.toml"),
        },
        check=False,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout
    assert f"{bp}/blueprint.toml:5: sandbox.kind: must be 'none'" in proc.stdout + proc.stderr
