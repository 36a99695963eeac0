"""Issue 20 (sections 1, 2, 3, 8) from the attacker's side, in the test bed.

A real user's shell (alice) races the daemon while her agents start: she swaps
her agent's scratch `home` and throwaway `upper`/`work` folders, and her
workdir, for links to folders she cannot reach (a root `mktemp -d` folder,
her whole home). An agent plants a `.git` file naming her home (or
`~/.config`) for the next run to bind. An agent fills its scratch. Each
attack succeeded against the code before the fix (see the commit message).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from testbed import Testbed

SCRATCH = "/var/lib/leviath/scratch"
SCOPES = "/sys/fs/cgroup/systemd/leviath.slice"
WORK = "/srv/races-alice"
SECRET = "root-only-secret-9f31"
KEY = "-----BEGIN OPENSSH PRIVATE KEY----- scratch-race-test"

# Alice's racer: watch for new agent scopes (their names end in the agent's
# id) and, for each, keep trying to put a link to TARGET in place of NAME in
# its scratch folder, until STOP exists. Prints how many swaps it made.
SWAP_SCRATCH = r"""
import os, sys, time
scopes, scratch, stop = sys.argv[1:4]
pairs = [p.split("=", 1) for p in sys.argv[4:]]
todo, swapped = {}, 0
while not os.path.exists(stop):
    try:
        names = os.listdir(scopes)
    except OSError:
        names = []
    for n in names:
        if n.startswith("leviath-alice-") and n.endswith(".scope"):
            ident = n[:-6].rsplit("-", 1)[-1]
            todo.setdefault(ident, {name for name, _ in pairs})
    for ident, left in todo.items():
        for name, target in pairs:
            if name not in left:
                continue
            path = os.path.join(scratch, ident, name)
            try:
                os.rename(path, path + ".moved")
                os.symlink(target, path)
                left.discard(name)
                swapped += 1
            except OSError:
                pass
print(swapped, flush=True)
"""

# Alice's racer: flip PROJ between the real folder (20 ms) and a link to
# TARGET (5 ms) until the file STOP appears.
FLIP_WORKDIR = r"""
import os, sys, time
proj, target, stop = sys.argv[1:4]
real = proj + ".real"
flips = 0
while not os.path.exists(stop):
    try:
        time.sleep(0.02)
        os.rename(proj, real)
        os.symlink(target, proj)
        time.sleep(0.005)
        os.unlink(proj)
        os.rename(real, proj)
        flips += 1
    except OSError:
        pass
print(flips, flush=True)
"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    alice = testbed.users["alice"]
    h = alice.home
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.run(f"""
        set -e
        mkdir -p {h}/.ssh {h}/.config/systemd/user {h}/races/proj {h}/races/bp
        printf '%s' '{KEY}' > {h}/.ssh/id_ed25519
        chmod 600 {h}/.ssh/id_ed25519
        echo '# alice rc' > {h}/.bashrc
        echo proj-file > {h}/races/proj/marker
    """, user="alice")  # fmt: skip
    # Outside the home: mount points for the workdir are made inside the
    # agent's home, which the home-swap test points elsewhere.
    testbed.run(["sh", "-c", f"mkdir -p {WORK} && chown alice: {WORK} && chmod 700 {WORK}"])
    yield testbed
    testbed.run(f"rm -rf {h}/races {WORK}", check=False)


def _root_secret_dir(bed: Testbed, where: str = "/tmp") -> str:
    """A root `mktemp -d` folder (0700) holding `pub/secret`, readable by all
    but reachable by root alone: returns the folder."""
    d = bed.run(["mktemp", "-d", "-p", where]).stdout.strip()
    bed.run(["sh", "-c", f"mkdir {d}/pub && echo {SECRET} > {d}/pub/secret"])
    return d


def _blueprint(bed: Testbed, name: str, stage_cmd: str, *, sandbox: str = "") -> str:
    home = bed.users["alice"].home
    folder = f"{home}/races/bp/{name}"
    text = (
        f'[agent]\nname = "{name}"\nversion = "1.0.0"\ndescription = "race"\n\n'
        '[seed]\ncommands = [["sleep", "2"]]\n\n'
        f"[stages.look]\ncommand = {json.dumps(['sh', '-c', stage_cmd])}\n"
        + (f"\n[stages.look.sandbox]\n{sandbox}\n" if sandbox else "")
    )
    bed.run(["mkdir", "-p", folder], user="alice")
    bed.run(f"cat > {folder}/blueprint.toml", user="alice", input=text)
    return folder


def _wait_ended(bed: Testbed, agent_id: str, timeout: float = 60) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="alice").stdout)
        for row in rows:
            if row["id"] == agent_id and row["state"] != "running":
                return dict(row)
        time.sleep(0.3)
    raise AssertionError(f"agent {agent_id} did not end")


@contextlib.contextmanager
def _racer(bed: Testbed, *pairs: str, scratch: str = SCRATCH) -> Iterator[list[int]]:
    stop = f"{WORK}/racer.stop"
    bed.run(["rm", "-f", stop], user="alice")
    proc = subprocess.Popen(
        bed.command(["python3", "-c", SWAP_SCRATCH, SCOPES, scratch, stop, *pairs],
                    user="alice"),
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    swaps: list[int] = []
    try:
        yield swaps
    finally:
        bed.run(["touch", stop], user="alice")
        swaps.append(int(proc.communicate(timeout=30)[0] or 0))


def _start(bed: Testbed, folder: str, mode: str) -> str:
    """Start the blueprint detached in WORK, wait for its end, return what its
    stage wrote to out.txt and its output."""
    out = f"{WORK}/out.txt"
    bed.run(["rm", "-f", out], user="alice")
    r = bed.run(["lev", "run", "-d", "--workdir-mode", mode, folder], user="alice",
                cwd=WORK, check=False)  # fmt: skip
    logs = ""
    if r.returncode == 0:
        agent_id = r.stdout.strip().split()[-1]
        _wait_ended(bed, agent_id)
        logs = bed.run(["lev", "logs", agent_id], user="alice", check=False).stdout
    return bed.run(["cat", out], check=False).stdout + logs


def test_a_swapped_scratch_home_never_becomes_the_agents_home(bed: Testbed) -> None:
    secret_dir = _root_secret_dir(bed)
    # The seed step sleeps: the stage's fence is built while the racer has
    # long had its chance, the first step's while it races.
    folder = _blueprint(bed, "homeswap", "{ ls -a ~; cat ~/secret; } > out.txt 2>&1")
    with _racer(bed, f"home={secret_dir}/pub", f"tmp={secret_dir}/pub") as swaps:
        outputs = [_start(bed, folder, "rw") for _ in range(4)]
    assert not [o for o in outputs if SECRET in o], (outputs, swaps)
    assert bed.run(["stat", "-c", "%u %a", secret_dir]).stdout.split() == ["0", "700"]


def test_swapped_throwaway_layers_never_take_the_agents_writes(bed: Testbed) -> None:
    # Both on /run (a tmpfs), so an overlay over them would mount.
    target = _root_secret_dir(bed, "/run")
    bed.run(["mkdir", f"{target}/upper", f"{target}/work"])
    # The layers' own folder may be root's: alice swaps the folder above it
    # for one of hers whose links lead to root's folders.
    fake = f"{WORK}/fake-overlay"
    bed.run(["sh", "-c", f"mkdir -p {fake}/0 && ln -sfn {target}/upper {fake}/0/upper && "
             f"ln -sfn {target}/work {fake}/0/work"], user="alice", check=False)  # fmt: skip
    # A folder of alice's in the lower layer: the agent may create in it, and
    # overlayfs copies it up (with root's credentials) into whatever upper is.
    bed.run(["mkdir", "-p", f"{WORK}/leviathd.service.d"], user="alice")
    folder = _blueprint(bed, "layerswap", "echo pwned > leviathd.service.d/zz-agent.conf && "
                        "cat leviathd.service.d/zz-agent.conf")
    # Scratch on a tmpfs too: overlayfs refuses the bed's own overlay root as
    # an upper layer, which would end every throwaway run before the race.
    bed.write_file("/etc/leviath/config.toml",
                   '[sandbox]\nkind = "namespace"\nscratch_dir = "/run/lev-scratch"\n')
    bed.run(["systemctl", "reload", "leviathd"])
    try:
        with _racer(bed, f"overlay={fake}", scratch="/run/lev-scratch") as swaps:
            outputs = [_start(bed, folder, "throwaway") for _ in range(4)]
    finally:
        bed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
        bed.run(["systemctl", "reload", "leviathd"])
    assert bed.run(["ls", "-A", f"{target}/upper"]).stdout.split() == [], swaps
    assert bed.run(["find", target, "-name", "zz-agent.conf"]).stdout == ""
    # The agent's write went to its own throwaway layer (in its scratch
    # filesystem, where overlayfs takes its layers even in the bed).
    assert all("pwned" in o for o in outputs), outputs
    assert bed.run(["ls", "-A", f"{WORK}/leviathd.service.d"]).stdout == ""


def test_the_scratch_folder_is_out_of_its_users_reach(bed: Testbed) -> None:
    folder = _blueprint(bed, "reach", "echo reach > out.txt")
    r = bed.run(["lev", "run", "-d", folder], user="alice", cwd=WORK)
    agent_id = r.stdout.strip().split()[-1]
    seen = bed.run(["ls", "-A", f"{SCRATCH}/{agent_id}"], user="alice", check=False)
    _wait_ended(bed, agent_id)
    assert seen.returncode != 0 and seen.stdout == "", seen


@pytest.mark.parametrize("target", ["home", "/run"])
def test_a_workdir_flipped_to_a_link_never_shows_the_links_target(
    bed: Testbed, target: str
) -> None:
    alice = bed.users["alice"]
    target = alice.home if target == "home" else target
    proj = f"{alice.home}/races/flip"
    stop = f"{alice.home}/races/flip.stop"
    bed.run(["sh", "-c", f"rm -rf {proj} {proj}.real {stop}; mkdir -p {proj}; "
             f"touch {proj}/in-the-project"], user="alice")  # fmt: skip
    racer = subprocess.Popen(
        bed.command(["python3", "-c", FLIP_WORKDIR, proj, target, stop], user="alice"),
        stdout=subprocess.PIPE, text=True,
    )
    leaked, ran = [], 0
    try:
        for _ in range(25):
            # A run that opened the link itself got /run as its workdir, as
            # `lev run --workdir /run` would (its hidden parts masked): what
            # must never show is what a hidden path or the home holds.
            r = bed.run(["lev", "run", "--workdir", proj, "--", "sh", "-c",
                         "cat .ssh/id_ed25519; ls -a; test -S dbus/system_bus_socket && "
                         "echo REACHED-BUS; ls leviath/agents | sed s/^/AGENT-/"],
                        user="alice", check=False)  # fmt: skip
            if any(s in r.stdout for s in (KEY, ".bashrc", "REACHED-BUS", "AGENT-")):
                leaked.append(r.stdout)
            ran += "in-the-project" in r.stdout
    finally:
        bed.run(["touch", stop], user="alice")
        flips = racer.communicate(timeout=30)[0]
    assert int(flips or 0) > 0
    assert not leaked, leaked
    # Runs that started before or after a flip saw their project: the race
    # costs a refused start at most.
    assert ran > 0


def _plant_git_files(bed: Testbed, folder: str, targets: tuple[str, ...]) -> None:
    home = bed.users["alice"].home
    proj = f"{home}/races/{folder}"
    bed.run(["mkdir", "-p", proj], user="alice")
    for target in targets:
        # The agent plants the file; the next run in the same folder tries it.
        # (Once there, a .git file is protected: the agent can no longer change it.)
        bed.run(["rm", "-f", f"{proj}/.git"], user="alice")
        bed.run(["lev", "run", "--workdir", proj, "--", "sh", "-c",
                 f"printf 'gitdir: {target}\\n' > .git"], user="alice")  # fmt: skip
        bed.run(["lev", "run", "--workdir", proj, "--", "sh", "-c",
                 "echo 'echo pwned' >> ~/.bashrc; mkdir -p ~/.config/systemd/user; "
                 "echo x > ~/.config/systemd/user/agent.service; true"],
                user="alice", check=False)  # fmt: skip
        assert bed.read_file(f"{home}/.bashrc") == "# alice rc\n", target
        assert bed.run(["test", "-e", f"{home}/.config/systemd/user/agent.service"],
                       check=False).returncode != 0, target  # fmt: skip


def test_a_git_file_naming_the_home_or_config_is_never_bound(bed: Testbed) -> None:
    home = bed.users["alice"].home
    _plant_git_files(bed, "gitproj", (home, f"{home}/.config", "~/.config", "../.."))


def test_in_a_container_a_git_file_naming_the_home_or_config_is_never_bound(
    bed: Testbed,
) -> None:
    from test_container import BUILD_IMAGE, IMAGE  # the bed's busybox image

    r = bed.run(BUILD_IMAGE, check=False, timeout=300)
    if r.returncode == 3:
        if os.environ.get("LEVIATH_REQUIRE_TESTBED", "") not in ("", "0"):
            pytest.fail(r.stderr.strip(), pytrace=False)
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stderr
    bed.write_file("/etc/leviath/config.toml",
                   f'[sandbox]\nkind = "container"\nimage = "{IMAGE}"\nnetwork = false\n')
    bed.run(["systemctl", "restart", "leviathd"])
    try:
        home = bed.users["alice"].home
        _plant_git_files(bed, "cgitproj", (f"{home}/.config", home))
    finally:
        bed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
        bed.run(["systemctl", "restart", "leviathd"])


def test_scratch_is_bounded_by_the_configured_size(bed: Testbed) -> None:
    bed.write_file("/etc/leviath/config.toml",
                   '[sandbox]\nkind = "namespace"\nscratch_size = "8M"\n')  # fmt: skip
    bed.run(["systemctl", "reload", "leviathd"])
    try:
        home = bed.users["alice"].home
        r = bed.run(["lev", "run", "--workdir", f"{home}/races/proj", "--", "sh", "-c",
                     "dd if=/dev/zero of=$HOME/big bs=1M count=20 2>&1; echo rc=$?; "
                     "ls -l $HOME/big"], user="alice", check=False)  # fmt: skip
        assert "rc=0" not in r.stdout, r.stdout
        assert "No space left on device" in r.stdout, r.stdout
    finally:
        bed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
        bed.run(["systemctl", "reload", "leviathd"])
