"""`lev validate`: the spec's output, its finding codes and its exit statuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from leviathd.cli.main import main

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CTO = FIXTURES / "blueprints" / "cto"

# leviath-security.md, "Reading outside the workdir": the console block, as printed.
SPEC_OUTPUT = (
    "✓ Blueprint 'cto' is valid.\n"
    "  3 stages, version 1.0.0\n"
    "  WARN your config does not grant glob:~/design-docs/**: reads matching them will be "
    "refused [read-paths-not-granted]\n"
    '       add to your config.toml: [agent_read_paths.cto] allow = ["glob:~/design-docs/**"]\n'
    "  NOTE declares [read_paths] (reads outside the run workdir): 2 declared, 1 granted "
    "[read-paths-declared]\n"
    "       ~/.leviath/runs: granted; glob:~/design-docs/**: NOT granted\n"
)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No real /etc or home: machine config absent, user config = the spec's grant."""
    monkeypatch.setenv("LEVIATH_CONFIG", str(tmp_path / "etc-config.toml"))
    monkeypatch.setenv("LEVIATH_USER_CONFIG", str(FIXTURES / "configs" / "cto-user.toml"))
    monkeypatch.setenv("LEVIATH_AGENT_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def lev(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_validate_prints_what_the_spec_shows_for_the_cto_example(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = lev(capsys, "validate", str(CTO))
    assert out == SPEC_OUTPUT
    assert rc == 0


def test_validate_accepts_the_blueprint_toml_or_an_installed_name(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert lev(capsys, "validate", str(CTO / "blueprint.toml"))[1] == SPEC_OUTPUT
    shutil.copytree(CTO, env / "store" / "cto")
    assert lev(capsys, "validate", "cto")[1] == SPEC_OUTPUT


def test_a_bare_name_is_the_installed_agent_never_a_folder_here(
    env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(CTO, env / "store" / "cto")
    here = env / "here"
    (here / "cto").mkdir(parents=True)
    (here / "cto" / "blueprint.toml").write_text("[agent]\nname = \"impostor\"\n")
    monkeypatch.chdir(here)
    assert lev(capsys, "validate", "cto")[1] == SPEC_OUTPUT
    assert "invalid" in lev(capsys, "validate", "./cto")[1]  # the folder, by path
    shutil.rmtree(env / "store" / "cto")
    rc, _, err = lev(capsys, "validate", "cto")
    assert rc == 1 and "./cto" in err


def test_deny_warnings_turns_a_warning_into_exit_status_2(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, _ = lev(capsys, "validate", str(CTO), "--deny-warnings")
    assert rc == 2


def test_once_everything_is_granted_only_the_note_remains_and_exit_is_0(
    env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    user = env / "user.toml"
    user.write_text(
        '[agent_read_paths.cto]\nallow = ["~/.leviath/runs", "glob:~/design-docs/**"]\n'
    )
    monkeypatch.setenv("LEVIATH_USER_CONFIG", str(user))
    rc, out, _ = lev(capsys, "validate", str(CTO), "--deny-warnings")
    assert rc == 0
    assert "WARN" not in out
    assert "2 declared, 2 granted [read-paths-declared]" in out
    assert "~/.leviath/runs: granted; glob:~/design-docs/**: granted" in out


def test_an_invalid_blueprint_exits_1_and_says_where(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = env / "bad"
    bad.mkdir()
    (bad / "blueprint.toml").write_text(
        '[agent]\nname = "bad"\ncommand = ["x"]\n[read_paths]\nallow = ["regex:.*"]\n'
    )
    rc, out, _ = lev(capsys, "validate", str(bad))
    assert rc == 1
    assert out.splitlines() == [
        f"✗ Blueprint at {bad} is invalid.",
        f"  ERROR {bad}/blueprint.toml:5: read_paths.allow[0]: 'regex:.*': a regex must be "
        "absolute: start with '/', '~/' or a drive letter (use glob: for paths relative to "
        "the workdir)",
    ]


def test_overruled_loosenings_discarded_engine_and_unknown_tools_are_shown(
    env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = env / "etc-config.toml"
    machine.write_text('[sandbox]\nkind = "container"\nnetwork = false\n')
    bp = env / "loose"
    bp.mkdir()
    (bp / "blueprint.toml").write_text(
        '[agent]\nname = "loose"\nversion = "0.1"\ncommand = ["x"]\n'
        '[sandbox]\nkind = "none"\nengine = "docker"\nnetwork = true\n'
        '[permissions]\nteleport = "deny"\n'
    )
    rc, out, _ = lev(capsys, "validate", str(bp))
    assert rc == 0
    assert out.splitlines()[:2] == ["✓ Blueprint 'loose' is valid.", "  0 stages, version 0.1"]
    for code in ("sandbox-kind-overruled", "engine-discarded", "network-overruled", "unknown-tool"):
        assert f"[{code}]" in out
    assert lev(capsys, "validate", str(bp), "--deny-warnings")[0] == 2


def test_json_output_carries_the_same_findings_and_counts(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = lev(capsys, "validate", str(CTO), "--json")
    data = json.loads(out)
    assert rc == 0 and data["exit"] == 0
    assert data["valid"] is True
    assert data["name"] == "cto" and data["version"] == "1.0.0"
    assert data["stages"] == ["analyze", "plan", "review"]
    assert data["read_paths"] == {
        "declared": ["~/.leviath/runs", "glob:~/design-docs/**"],
        "granted": ["~/.leviath/runs"],
    }
    assert [f["code"] for f in data["findings"]] == [
        "read-paths-not-granted",
        "read-paths-declared",
    ]


def test_an_unknown_name_is_a_one_line_error(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = lev(capsys, "validate", "no-such-agent")
    assert rc == 1
    assert err.startswith("lev: no-such-agent: no such blueprint")
    assert out == ""


def test_a_broken_user_config_is_reported_with_its_file_and_line(
    env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    user = env / "user.toml"
    user.write_text('[sandbox]\nkind = "vm"\n')
    monkeypatch.setenv("LEVIATH_USER_CONFIG", str(user))
    rc, _, err = lev(capsys, "validate", str(CTO))
    assert rc == 1
    assert (
        err
        == f"lev: {user}:2: sandbox.kind: must be 'none', 'namespace' or 'container', not 'vm'\n"
    )
