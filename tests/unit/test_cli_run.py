"""`lev run`'s command line: options anywhere before `--`, and messages that
say what was wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from leviathd.cli import run
from leviathd.cli.main import parse
from leviathd.errors import InvalidArgument, NotFound
from leviathd.safetext import NAME_RE


@pytest.mark.parametrize("argv", [
    ["run", "--detach", "my-agent", "--workdir", "/src/app"],
    ["run", "my-agent", "--workdir", "/src/app", "--detach"],
    ["run", "-w", "/src/app", "-d", "my-agent"],
])
def test_options_before_or_after_the_blueprint(argv: list[str]) -> None:
    args = parse(argv)
    assert (args.blueprint, args.workdir, args.detach) == ("my-agent", "/src/app", True)
    assert args.command_argv is None


def test_everything_after_the_double_dash_is_the_command() -> None:
    args = parse(["run", "--detach", "--", "make", "--workdir", "x", "--", "-d"])
    assert args.blueprint is None and args.workdir is None and args.detach
    assert args.command_argv == ["make", "--workdir", "x", "--", "-d"]


def test_messages_name_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="nothing to run: give a blueprint"):
        run.build_request(parse(["run", "-w", str(tmp_path)]))
    with pytest.raises(InvalidArgument, match="nothing to run after --"):
        run.build_request(parse(["run", "--"]))
    with pytest.raises(InvalidArgument, match="not both"):
        run.build_request(parse(["run", "my-agent", "--", "id"]))
    with pytest.raises(SystemExit):
        parse(["run", "one", "two"])


def test_a_blueprint_given_with_options_after_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = tmp_path / "store" / "my-agent"
    agent.mkdir(parents=True)
    (agent / "blueprint.toml").write_text('[agent]\nname = "my-agent"\n')
    monkeypatch.setenv("LEVIATH_AGENT_STORE", str(tmp_path / "store"))
    req = run.build_request(parse(["run", "my-agent", "--workdir", str(tmp_path)]))
    assert req["workdir"].value == str(tmp_path)
    assert "my-agent" in req["blueprint"].value and "command" not in req
    assert req["blueprint_source"].value == str(agent / "blueprint.toml")


@given(st.text(alphabet=st.sampled_from("aZ09_-.\n/ é\0x"), max_size=70))
@example("a" * 64)
@example("a" * 65)
@example("a\n")
@example("a\n\n")
@example("-a")
@example("")
def test_is_name_agrees_with_the_name_rules(arg: str) -> None:
    # lev run tells an installed agent's name from a path without re.
    assert run.is_name(arg) == bool(NAME_RE.match(arg))


def test_a_blueprint_folder_is_read_by_its_real_path(tmp_path: Path) -> None:
    (tmp_path / "bp").mkdir()
    (tmp_path / "bp" / "blueprint.toml").write_text('[agent]\nname = "x"\ncommand = ["true"]\n')
    (tmp_path / "link").symlink_to(tmp_path / "bp")
    req = run.build_request(parse(["run", str(tmp_path / "link"), "-w", str(tmp_path)]))
    assert req["blueprint_source"].value == str(tmp_path / "bp" / "blueprint.toml")
    assert 'command = ["true"]' in req["blueprint"].value
    with pytest.raises(NotFound, match="no blueprint at"):
        run.build_request(parse(["run", str(tmp_path / "none"), "-w", str(tmp_path)]))


def _signal(sender: str, member: str, body: list[object], sig: str) -> object:
    from leviathd.cli import wire

    return wire.Message(wire.SIGNAL, sender=sender, path="/org/leviath/Manager1",
                        interface="org.leviath.Manager1", member=member, signature=sig,
                        body=body)


def test_an_attached_run_hears_its_hook_changes_in_the_daemons_signal_only() -> None:
    """Issue 47 item 3: `lev run` no longer asks with Get after the end;
    the daemon's AgentHookChanges (just before its AgentEnded) says what to
    list. A look-alike from another connection (any local user can unicast
    one) or one about another agent is not listed."""
    from leviathd.cli import run, wire

    def client(*signals: object) -> wire.SyncClient:
        c = wire.SyncClient.__new__(wire.SyncClient)
        c.conn = wire.Connection.__new__(wire.Connection)
        c.conn.keep_signals_from = ":1.5"
        c.conn.signals = list(signals)  # type: ignore[arg-type]
        c.conn.wakeup = None
        c._daemon = ":1.5"
        return c

    ended = _signal(":1.5", "AgentEnded", ["abcd1234", 3, "exited"], "sis")
    forged = _signal(":1.66", "AgentHookChanges", ["abcd1234", ["/home/a/.envrc (added)"]],
                     "sas")
    other = _signal(":1.5", "AgentHookChanges", ["ffff0000", ["/home/a/x (added)"]], "sas")
    assert run._wait_attached(client(forged, other, ended), "abcd1234") == (3, [])
    told = _signal(":1.5", "AgentHookChanges", ["abcd1234", ["/home/a/.envrc (added)"]],
                   "sas")
    assert run._wait_attached(client(told, ended), "abcd1234") == (
        3, ["/home/a/.envrc (added)"])
