"""What an agent never sees, in the fence and through the broker alike.

One list at the ground floor, so that the sandbox spec (what is mounted) and
the broker's read checks (what a tool call may open) cannot disagree: a grant
of `~/.config` must not open `~/.config/gh`, whichever way the agent asks.
Admins add to it with `[security] hidden_paths`; nothing takes from it.
"""

from __future__ import annotations

# Never visible, relative to the home folder...
HIDDEN_IN_HOME: tuple[str, ...] = (
    ".ssh",
    ".gnupg",
    ".1password",
    ".config/op",
    ".config/gh",
    ".gitconfig",
    ".git-credentials",
    ".config/git/credentials",
    ".netrc",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".config/containers/auth.json",
    ".npmrc",
    ".pypirc",
    ".yarnrc",
    ".yarnrc.yml",
    ".gradle/gradle.properties",
    ".m2/settings.xml",
    ".config/composer/auth.json",
    ".composer/auth.json",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".local/share/keyrings",
    ".password-store",
    ".config/leviath",
)
# The agent CLIs' logins (proxy/loginfiles.py reads the same files): the
# fence shows placeholders in their place, so they are not hidden from it;
# but the broker's grants, whose reads outside the workdir are the host's
# view, never take them (policy/settings.py), whatever a grant covers.
CLI_LOGINS_IN_HOME: tuple[str, ...] = (
    ".claude/.credentials.json",
    ".codex/auth.json",
    ".gemini/oauth_creds.json",
)
# ...and absolute. "{uid}" is the user's uid.
HIDDEN_ABSOLUTE: tuple[str, ...] = (
    "/run/user/{uid}",
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/podman",
    "/var/run/podman",
    "/run/containerd",
    "/run/dbus",
    "/etc/leviath",
    "/var/lib/leviath",
    "/run/leviath",
)


def builtin_hidden(uid: int | None = None) -> tuple[str, ...]:
    """The built-in list as `~/` and absolute patterns. Without a uid, every
    user's runtime folder (/run/user) is hidden: stricter, never looser."""
    home = tuple(f"~/{rel}" for rel in HIDDEN_IN_HOME)
    machine = tuple(
        p.format(uid=uid) if uid is not None else p.replace("/{uid}", "")
        for p in HIDDEN_ABSOLUTE
    )
    return home + machine
