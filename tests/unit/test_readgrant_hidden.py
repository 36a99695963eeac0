"""A read grant never covers a hidden path (issue 19), in the broker's index
too: the index answers for every caller that checks an opened file's real
path (the file tools' run, the read ahead), whatever the gate decided before."""

from __future__ import annotations

from leviathd import readpatterns
from leviathd.policy.readgrant import build_index

HOME = "/home/alice"
WORK = "/home/alice/src/app"
HIDDEN = ("/home/alice/.config/gh", "/home/alice/.ssh")


def test_a_grant_over_a_folder_leaves_the_hidden_paths_inside_it_unread() -> None:
    index = build_index(["~/.config", "~/"], home=HOME, workdir=WORK, hidden=HIDDEN)
    for real in ("/home/alice/.config/gh/hosts.yml", "/home/alice/.config/gh",
                 "/home/alice/.ssh/id_ed25519"):
        assert not index.may_read(real), real
        assert not index.may_write(real), real
        assert not readpatterns.may_read(real, index.grants), real
    assert index.may_read("/home/alice/.config/git/ignore")
    assert index.may_read(WORK + "/main.py")


def test_a_hidden_path_inside_the_workdir_stays_hidden() -> None:
    index = build_index([], home=HOME, workdir=HOME, hidden=HIDDEN)
    assert not index.may_read("/home/alice/.ssh/id_ed25519")
    assert not index.may_write("/home/alice/.ssh/authorized_keys")
    assert index.may_read("/home/alice/notes.md")


def test_a_hidden_path_kept_elsewhere_by_a_link_is_hidden_where_it_leads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Red team, round 2: with ~/.claude and ~/.ssh links into ~/dotfiles
    (stow), a grant of ~/dotfiles read the real login and key there: the
    hidden paths were compared by name only, the decided paths are real."""
    home = tmp_path / "home"
    dot = home / "dotfiles"
    (dot / "claude").mkdir(parents=True)
    (dot / "ssh").mkdir()
    (home / ".claude").symlink_to(dot / "claude")
    (home / ".ssh").symlink_to(dot / "ssh")
    index = build_index(["~/dotfiles"], home=str(home), workdir=str(home / "w"),
                        hidden=("~/.ssh", "~/.claude/.credentials.json"))
    assert not index.may_read(str(dot / "ssh" / "id_ed25519"))
    assert not index.may_read(str(dot / "claude" / ".credentials.json"))
    assert index.may_read(str(dot / "claude" / "settings.json"))
