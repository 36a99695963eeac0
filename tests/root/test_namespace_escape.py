"""Escape checks against the real namespace launcher, run as root on this host.

Each run builds a real fence in a subprocess (its mounts live in a private
mount namespace, so the host's are never touched), runs a probe inside as
`nobody` with a throwaway home under /var/tmp, and the tests below assert, one
threat each, what the probe could and could not do. Skipped when not root or
when the host cannot build the fence (the reason is shown).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from leviathd.config.merge import Effective
from leviathd.config.models import SandboxKind
from leviathd.domain.mounts import MountRequest as ConfigMount
from leviathd.identity import UserInfo
from leviathd.sandbox import namespace, scratch
from leviathd.sandbox.namespace import sealed
from leviathd.sandbox.spec import (
    RunRequest,
    SandboxSpec,
    build_spec,
    host_exists,
    host_links,
    host_read_text,
    host_resolve,
)

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- planted-by-the-test"
CALLER_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "GITHUB_TOKEN": "ghp_planted",
    "OP_SERVICE_ACCOUNT_TOKEN": "ops_planted",
    "AWS_SECRET_ACCESS_KEY": "aws_planted",
    "SSH_AUTH_SOCK": "/run/user/65534/ssh",
    "DOCKER_HOST": "unix:///var/run/docker.sock",
    "NPM_TOKEN": "npm_planted",
}


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root to build namespaces"
    reason = namespace.probe()
    return f"the fence cannot be built here: {reason}" if reason else None


_WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))

# The probe runs inside the fence with the system python; it prints one JSON object.
PROBE = (REPO / "tests" / "escape_probe.py").read_text()

DRIVER = r"""
import json, sys
from leviathd.sandbox import namespace, scratch
from leviathd.sandbox.spec import SandboxSpec
spec = SandboxSpec.from_dict(json.load(open(sys.argv[1])))
scratch.create(spec)
keep = len(sys.argv) > 2
try:
    rc = namespace.run(spec)
finally:
    if not keep:
        scratch.remove(spec.scratch)
sys.exit(rc)
"""


@dataclass
class World:
    base: Path
    home: Path
    workdir: Path
    other_home: Path
    suid_dir: Path
    suid_id: Path
    scratch_dir: Path
    user: UserInfo
    port: int
    server: socket.socket

    def probe_config(self) -> str:
        return json.dumps(
            {
                "home": str(self.home),
                "workdir": str(self.workdir),
                "other_home": str(self.other_home),
                "suid_dir": str(self.suid_dir),
                "suid_id": str(self.suid_id),
                "port": self.port,
            }
        )

    def spec(
        self,
        argv: tuple[str, ...],
        *,
        network: bool = True,
        mode: str = "rw",
        execution: str = "e5ca9e01",
        workdir: Path | None = None,
    ) -> SandboxSpec:
        effective = Effective(
            kind=SandboxKind.NAMESPACE,
            network=network,
            scratch_dir=str(self.scratch_dir),
            mounts=[ConfigMount(path=str(self.suid_dir))],
        )
        return build_spec(
            effective,
            self.user,
            RunRequest(argv, str(workdir or self.workdir), mode, CALLER_ENV),  # type: ignore[arg-type]
            execution,
            existing=host_exists,
            resolve=host_resolve,
            read_text=host_read_text,
            links=host_links(),
            git_identity={"name": "Nobody", "email": "nobody@example.org"},
            other_homes=[str(self.other_home)],
        )

    def launch(
        self, spec: SandboxSpec, *, keep_scratch: bool = False, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        path = self.base / f"spec-{spec.execution_id}.json"
        path.write_text(json.dumps(spec.to_dict()))
        argv = [sys.executable, "-c", DRIVER, str(path)] + (["keep"] if keep_scratch else [])
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        )

    def probe(self, **kwargs: Any) -> dict[str, Any]:
        spec = self.spec(
            ("/usr/bin/python3", str(self.workdir / "probe.py"), self.probe_config()), **kwargs
        )
        done = self.launch(spec)
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result


def _own(path: Path) -> None:
    os.chown(path, NOBODY, NOBODY)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    base = Path(tempfile.mkdtemp(prefix="leviath-escape-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    home = base / "home" / "nobody"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text(SECRET)
    os.chmod(home / ".ssh" / "id_ed25519", 0o600)
    (home / ".ssh" / "known_hosts").write_text("github.com ssh-ed25519 AAAA\n")
    (home / ".gitconfig").write_text("[user]\n  name = Nobody\n")
    (home / ".claude").mkdir()
    workdir = home / "src" / "app"
    workdir.mkdir(parents=True)
    (workdir / "probe.py").write_text(PROBE)
    (workdir / "abs-link").symlink_to(home / ".ssh" / "id_ed25519")
    (workdir / "rel-link").symlink_to("../../.ssh/id_ed25519")
    for p in (home, home / ".ssh", home / ".ssh" / "id_ed25519", home / ".ssh" / "known_hosts",
              home / ".gitconfig", home / ".claude", home / "src", workdir):
        _own(p)
    os.chmod(home, 0o700)
    other = base / "home" / "bob"
    other.mkdir()
    (other / "diary").write_text("bob's")
    suid_dir = base / "suid"
    suid_dir.mkdir()
    suid_id = suid_dir / "id"
    shutil.copy2("/usr/bin/id", suid_id)
    os.chown(suid_id, 0, 0)
    os.chmod(suid_id, 0o4755)
    scratch_dir = base / "scratch"
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    user = UserInfo("nobody", NOBODY, NOBODY, (NOBODY,), str(home), "/bin/sh")
    w = World(base, home, workdir, other, suid_dir, suid_id, scratch_dir, user,
              server.getsockname()[1], server)
    (Path("/tmp") / f"host-only-{base.name}").write_text("host")
    try:
        yield w
    finally:
        server.close()
        (Path("/tmp") / f"host-only-{base.name}").unlink()
        shutil.rmtree(base)


@pytest.fixture(scope="module")
def inside(world: World) -> dict[str, Any]:
    return world.probe()


@pytest.fixture(scope="module")
def offline(world: World) -> dict[str, Any]:
    return world.probe(network=False, execution="e5ca9e02")


# --- credentials ------------------------------------------------------------


def test_a_planted_private_key_cannot_be_read_by_its_path(inside: dict[str, Any]) -> None:
    assert inside["key_by_path"] == "err:ENOENT"


def test_a_link_in_the_workdir_cannot_reach_the_key(inside: dict[str, Any]) -> None:
    assert inside["key_via_abs_link"] == "err:ENOENT"
    assert inside["key_via_rel_link"] == "err:ENOENT"


def test_proc_root_links_lead_only_into_the_sandbox(inside: dict[str, Any]) -> None:
    assert inside["key_via_proc1_root"].startswith("err:")
    assert inside["key_via_proc_self_root"] == "err:ENOENT"


def test_the_ssh_folder_holds_only_known_hosts_read_only(inside: dict[str, Any]) -> None:
    assert inside["ssh_dir"] == "ok:['known_hosts']"
    assert inside["known_hosts"].startswith("ok:github.com")
    assert inside["gitconfig"] == "err:ENOENT"


def test_the_home_is_empty_but_for_configured_entries(inside: dict[str, Any]) -> None:
    assert inside["home_listing"] == "ok:['.claude', '.ssh', 'src']"


def test_another_users_home_is_absent(world: World, inside: dict[str, Any]) -> None:
    assert inside["other_home"] == "err:ENOENT"


def test_secret_variables_from_the_caller_are_absent(inside: dict[str, Any]) -> None:
    env = inside["env"]
    for name in ("GITHUB_TOKEN", "OP_SERVICE_ACCOUNT_TOKEN", "AWS_SECRET_ACCESS_KEY",
                 "SSH_AUTH_SOCK", "DOCKER_HOST", "NPM_TOKEN"):
        assert name not in env, name
    assert env["HOME"] == inside["env"]["HOME"] and env["USER"] == "nobody"
    assert env["GIT_AUTHOR_EMAIL"] == "nobody@example.org"


# --- files --------------------------------------------------------------------


def test_tmp_is_private(world: World, inside: dict[str, Any]) -> None:
    assert f"host-only-{world.base.name}" not in inside["tmp_listing"]
    assert inside["write_tmp"] == "ok"
    assert not Path("/tmp/agent-was-here").exists()


def test_workdir_writes_persist_and_home_writes_stay_in_scratch(
    world: World, inside: dict[str, Any]
) -> None:
    assert inside["write_workdir"] == "ok"
    assert (world.workdir / "agent-was-here").exists()
    assert inside["write_home"] == "ok"
    assert not (world.home / "agent-was-here").exists()
    assert inside["cwd"] == str(world.workdir)


def test_writes_anywhere_else_fail(world: World, inside: dict[str, Any]) -> None:
    for place in ("/usr/agent", "/etc/agent", "/opt/agent", "/agent", "/dev/agent",
                  "/proc/agent"):
        assert inside["write " + place] in ("err:EROFS", "err:EACCES", "err:ENOENT"), place
    # A folder mounted read-only from config, writable on the host by root only.
    assert inside[f"write {world.suid_dir}/agent"] == "err:EROFS"


def test_a_mount_beneath_a_read_only_bind_is_read_only_nosuid_and_nodev(world: World) -> None:
    # A writable tmpfs mounted on the host beneath a folder the fence binds
    # read-only (in a private mount namespace of the driver's: the host's
    # table is untouched). The bind brings it along; it must be locked too.
    sub = world.suid_dir / "sub"
    sub.mkdir(exist_ok=True)
    spec = world.spec(("/bin/sh", "-c", f"touch {sub}/planted 2>/dev/null && echo wrote; "
                       f"grep ' {sub} ' /proc/self/mountinfo"), execution="e5ca9e0b")
    path = world.base / "spec-sub.json"
    path.write_text(json.dumps(spec.to_dict()))
    script = (f"mount -t tmpfs -o mode=0777 leviath-test {sub} && "
              f'exec {sys.executable} -c "$0" {path}')
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, DRIVER],
        capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "wrote" not in done.stdout
    (line,) = done.stdout.splitlines()
    options = set(line.split()[5].split(","))
    assert {"ro", "nosuid", "nodev"} <= options, line


def test_a_read_only_workdir_refuses_writes(world: World) -> None:
    spec = world.spec(("/bin/sh", "-c", f"echo x > {world.workdir}/ro-attempt"), mode="ro",
                      execution="e5ca9e03")
    done = world.launch(spec)
    assert done.returncode != 0
    assert "Read-only file system" in done.stderr
    assert not (world.workdir / "ro-attempt").exists()


def test_a_throwaway_workdir_takes_writes_and_forgets_them(world: World) -> None:
    script = f"echo x > {world.workdir}/thrown && cat {world.workdir}/thrown"
    spec = world.spec(("/bin/sh", "-c", script), mode="throwaway", execution="e5ca9e04")
    done = world.launch(spec)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "x"
    assert not (world.workdir / "thrown").exists()


def test_a_home_entry_linking_past_a_folder_the_user_cannot_enter_is_not_mounted(
    world: World,
) -> None:
    locked = world.base / "root-only"
    (locked / "pip").mkdir(parents=True)
    (locked / "pip" / "secret").write_text("root-only secret")
    os.chmod(locked, 0o700)
    os.chmod(locked / "pip" / "secret", 0o644)  # readable, but behind a 0700 folder
    cache = world.home / ".cache"
    cache.mkdir()
    _own(cache)
    (cache / "pip").symlink_to(locked / "pip")
    try:
        spec = world.spec(("/bin/cat", f"{world.home}/.cache/pip/secret"), execution="e5ca9e08")
        assert any(m.target == f"{world.home}/.cache/pip" for m in spec.mounts)
        done = world.launch(spec)
        assert done.returncode != 0
        assert "root-only secret" not in done.stdout
        assert "Permission denied" in done.stderr and "uid 65534" in done.stderr
    finally:
        shutil.rmtree(cache)
        shutil.rmtree(locked)


def test_a_worktrees_main_git_folder_is_writable_inside(world: World) -> None:
    repo = world.base / "repos" / "app"
    worktree = world.home / "src" / "wt"
    nobody_env = {"PATH": "/usr/bin:/bin", "HOME": str(world.home)}

    def git(*args: str, cwd: Path) -> None:
        subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, user=NOBODY,
                       group=NOBODY, extra_groups=[], env=nobody_env)

    repo.mkdir(parents=True)
    os.chown(repo.parent, NOBODY, NOBODY)
    _own(repo)
    ident = ("-c", "user.name=n", "-c", "user.email=n@x")
    git("init", "-q", "-b", "main", cwd=repo)
    git(*ident, "commit", "-q", "--allow-empty", "-m", "first", cwd=repo)
    git("worktree", "add", "-q", "-b", "side", str(worktree), cwd=repo)
    try:
        spec = world.spec(("/usr/bin/git", "commit", "-q", "--allow-empty", "-m", "from inside"),
                          execution="e5ca9e09", workdir=worktree)
        assert any(m.target == str(repo / ".git") and not m.readonly for m in spec.mounts)
        done = world.launch(spec)
        assert done.returncode == 0, done.stderr
        log = subprocess.run(["git", "-C", str(repo), "log", "--format=%s", "side"],
                             capture_output=True, text=True, check=True, user=NOBODY,
                             group=NOBODY, extra_groups=[], env=nobody_env).stdout
        assert log.splitlines()[0] == "from inside"
    finally:
        shutil.rmtree(worktree)
        shutil.rmtree(world.base / "repos")


# --- network ----------------------------------------------------------------


def test_with_network_the_hosts_loopback_is_reachable(inside: dict[str, Any]) -> None:
    # The control for the next test: the probe does reach a listening server.
    assert inside["tcp_host_loopback"] == "ok"


def test_without_network_only_lo_exists_and_the_hosts_loopback_is_unreachable(
    offline: dict[str, Any],
) -> None:
    assert offline["interfaces"] == ["lo"]
    assert offline["tcp_host_loopback"] == "err:ECONNREFUSED"


# --- privileges -----------------------------------------------------------------


def test_no_capabilities_and_no_new_privileges(inside: dict[str, Any]) -> None:
    assert int(inside["CapEff"], 16) == 0
    assert int(inside["CapBnd"], 16) == 0
    assert inside["NoNewPrivs"] == "1"
    assert inside["Seccomp"] == "2"
    assert inside["uid"] == [NOBODY] * 3


def test_a_setuid_binary_does_not_raise_privileges(world: World, inside: dict[str, Any]) -> None:
    # Control: outside the fence the same binary does make nobody root.
    outside = subprocess.run([str(world.suid_id), "-u"], capture_output=True, text=True,
                             user=NOBODY, group=NOBODY, extra_groups=[])
    assert outside.stdout.strip() == "0"
    assert inside["suid_euid"] == str(NOBODY)


@pytest.mark.skipif(
    not any(os.path.exists(p) for p in sealed.INIT_CANDIDATES), reason="no catatonit here"
)
def test_pid1_is_a_sealed_catatonit_the_agent_can_neither_read_nor_trace(world: World) -> None:
    """Issue 18: PID 1 is catatonit, not a Python process. Run from the
    host's file (readable by all) it was dumpable, and the probe's ptrace of
    PID 1 succeeded and froze it (seen: test_mount_unshare_setns_and_ptrace_fail
    hung); the sealed copy is exec-only for the agent's user."""
    script = (
        "cat /proc/1/comm; "
        "ls -l /proc/1/exe >/dev/null 2>&1 && echo EXE-READABLE; "
        "cat /proc/1/maps >/dev/null 2>&1 && echo MAPS-READABLE; "
        "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); "
        "print(\"PTRACE\", l.ptrace(0x4206, 1, None, None), ctypes.get_errno())'; "
        "exit 7"
    )
    done = world.launch(world.spec(("/bin/sh", "-c", script)))
    assert done.returncode == 7, done.stderr
    lines = done.stdout.split("\n")
    assert lines[0].startswith("memfd:leviath"), done.stdout
    assert "EXE-READABLE" not in done.stdout and "MAPS-READABLE" not in done.stdout
    # PTRACE_SEIZE (it would not stop PID 1 if it were allowed): EPERM.
    assert "PTRACE -1 1" in done.stdout


def test_a_missing_command_ends_with_127_and_says_so(world: World) -> None:
    done = world.launch(world.spec(("no-such-command-here",)))
    assert done.returncode == 127
    assert "cannot run no-such-command-here" in done.stderr


def test_mount_unshare_setns_and_ptrace_fail(inside: dict[str, Any]) -> None:
    assert inside["mount"] == "err:EPERM"
    assert inside["unshare_mnt"] == "err:EPERM"
    assert inside["unshare_user"] == "err:EPERM"
    assert inside["setns_self"] == "err:EPERM"
    assert inside["setns_pid1"].startswith("err:")
    assert inside["ptrace_pid1"] == "err:EPERM"


def test_only_the_sandboxs_own_processes_are_visible(inside: dict[str, Any]) -> None:
    assert inside["pids"][0] == 1 and len(inside["pids"]) <= 4
    assert inside["hostname"] == "leviath-e5ca9e01"


# --- life cycle ---------------------------------------------------------------


def test_scratch_is_gone_after_a_run(world: World, inside: dict[str, Any]) -> None:
    assert not (world.scratch_dir / "e5ca9e01").exists()
    st = os.stat(world.scratch_dir)
    assert st.st_uid == 0 and st.st_mode & 0o077 in (0o011, 0)


def test_killing_the_launcher_ends_the_agent_and_sweep_removes_its_scratch(world: World) -> None:
    marker = world.workdir / "started"
    spec = world.spec(("/bin/sh", "-c", f"touch {marker}; exec sleep 300"), execution="e5ca9e05")
    path = world.base / "spec-kill.json"
    path.write_text(json.dumps(spec.to_dict()))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(path), "keep"],
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    try:
        deadline = time.monotonic() + 20
        while not marker.exists():
            assert time.monotonic() < deadline, "the agent never started"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 10
    while _sleepers(world):
        assert time.monotonic() < deadline, "the agent outlived its launcher"
        time.sleep(0.05)
    assert (world.scratch_dir / "e5ca9e05").exists()
    assert scratch.sweep(str(world.scratch_dir), live={"e5ca9e99"}) == ["e5ca9e05"]
    assert not (world.scratch_dir / "e5ca9e05").exists()
    assert str(world.scratch_dir) not in Path("/proc/self/mountinfo").read_text()
    marker.unlink()


def test_stopping_the_launcher_stops_the_agent_with_the_signals_status(world: World) -> None:
    marker = world.workdir / "started-term"
    spec = world.spec(("/bin/sh", "-c", f"touch {marker}; exec sleep 300"), execution="e5ca9e07")
    path = world.base / "spec-term.json"
    path.write_text(json.dumps(spec.to_dict()))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(path)],
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    try:
        deadline = time.monotonic() + 20
        while not marker.exists():
            assert time.monotonic() < deadline, "the agent never started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (world.scratch_dir / "e5ca9e07").exists()
    marker.unlink()


def _sleepers(world: World) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            st = os.stat(f"/proc/{pid}")
        except OSError:
            continue
        if cmd[:2] == [b"sleep", b"300"] and st.st_uid == NOBODY:
            found.append(int(pid))
    return found


def test_a_fence_that_cannot_be_built_fails_clearly_and_leaves_nothing(world: World) -> None:
    spec = world.spec(("/bin/true",), execution="e5ca9e06")
    # The workdir vanishes between computing the spec and building the fence.
    broken = SandboxSpec.from_dict(
        spec.to_dict() | {"mounts": [m.__dict__ | ({"source": "/nonexistent/leviath"}
                                                    if m.why == "workdir" else {})
                                     for m in spec.mounts]}
    )
    code = (
        "import json,sys\n"
        "from leviathd.sandbox import namespace\n"
        "from leviathd.sandbox.spec import SandboxSpec\n"
        "from leviathd.errors import Unavailable\n"
        "spec = SandboxSpec.from_dict(json.load(open(sys.argv[1])))\n"
        "try:\n    namespace.run(spec)\nexcept Unavailable as e:\n"
        "    print('UNAVAILABLE', e); sys.exit(3)\n"
    )
    path = world.base / "spec-broken.json"
    path.write_text(json.dumps(broken.to_dict()))
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, env={"PYTHONPATH": str(REPO)}, timeout=30)
    assert done.returncode == 3, done.stderr
    assert "/nonexistent/leviath" in done.stdout
    assert not (world.scratch_dir / "e5ca9e06").exists()


# The supervisor's way (sandbox/supervisor.py, _run_step): it enters the
# step's namespaces itself, forks PID 1 straight into them and goes back.
STEP_DRIVER = r"""
import json, os, sys
from leviathd.sandbox import namespace, scratch
from leviathd.sandbox.spec import SandboxSpec
spec = SandboxSpec.from_dict(json.load(open(sys.argv[1])))
scratch.create(spec)
try:
    sup = os.fork()
    if sup == 0:
        kinds = ("pid", "net", "uts", "ipc")
        before = [os.readlink(f"/proc/self/ns/{k}") for k in kinds]
        scratch.enter(spec)
        step = namespace.enter_step(spec)
        pid1 = os.fork()
        if pid1 == 0:
            namespace.run_as_pid1(spec)
        step.leave()
        after = [os.readlink(f"/proc/self/ns/{k}") for k in kinds]
        # pid_for_children: our next child is ours again, not the agent's.
        kid = os.fork()
        if kid == 0:
            os._exit(0 if os.readlink("/proc/self/ns/pid") == before[0] else 9)
        _, kst = os.waitpid(kid, 0)
        _, st = os.waitpid(pid1, 0)
        step.end()
        print("BACK", before == after and os.waitstatus_to_exitcode(kst) == 0, flush=True)
        os._exit(os.waitstatus_to_exitcode(st))
    _, st = os.waitpid(sup, 0)
finally:
    scratch.remove(spec.scratch)
sys.exit(os.waitstatus_to_exitcode(st))
"""


def _step(world: World, spec: SandboxSpec, name: str) -> subprocess.CompletedProcess[str]:
    path = world.base / f"spec-{name}.json"
    path.write_text(json.dumps(spec.to_dict()))
    return subprocess.run([sys.executable, "-c", STEP_DRIVER, str(path)], capture_output=True,
                          text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          timeout=60)


def test_a_supervised_step_runs_fenced_and_its_supervisor_gets_its_namespaces_back(
    world: World,
) -> None:
    spec = world.spec(("/bin/sh", "-c", "echo pid $$; hostname; cat /etc/leviath/* 2>&1; "
                       "ls /proc | grep -c '^[0-9]'"), network=False, execution="e5ca9e0c")
    done = _step(world, spec, "step")
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert "BACK True" in out, done.stdout
    assert "pid 2" in out  # catatonit is 1, the command its child
    assert spec.hostname in out


def test_a_supervised_step_that_cannot_be_built_says_so_and_ends_127(world: World) -> None:
    spec = world.spec(("/bin/true",), execution="e5ca9e0d")
    broken = SandboxSpec.from_dict(
        spec.to_dict() | {"mounts": [m.__dict__ | ({"source": "/nonexistent/leviath"}
                                                    if m.why == "workdir" else {})
                                     for m in spec.mounts]}
    )
    done = _step(world, broken, "step-broken")
    assert done.returncode == 127, (done.stdout, done.stderr)
    assert "BACK True" in done.stdout
    assert ("leviath: could not start the agent: cannot build the namespace fence: "
            in done.stderr), done.stderr
    assert "/nonexistent/leviath" in done.stderr
    assert not (world.scratch_dir / "e5ca9e0d").exists()
