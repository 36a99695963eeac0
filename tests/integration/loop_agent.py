"""An agent the test drives from inside, one script at a time: its command
(LOOP) runs each script the test drops into .req/<hostname>/N.sh, in the
background, and leaves N.out, N.err and N.rc beside it. Shared by the bed
tests that act from inside a running agent step by step (the gate,
credentials, the SSH agent, the broker's bounds)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed import Testbed

LOOP = """
d=.req/$(hostname)
mkdir -p $d
n=1
while :; do
  if [ -f $d/$n.sh ]; then
    ( sh $d/$n.sh > $d/$n.out 2> $d/$n.err; echo $? > $d/$n.rc.tmp
      mv $d/$n.rc.tmp $d/$n.rc ) &
    n=$((n+1))
  else
    sleep 0.05
  fi
done
"""


@dataclass
class LoopAgent:
    bed: Testbed
    id: str
    workdir: str
    user: str = "alice"
    timeout: float = 60
    n: int = 0

    @property
    def dir(self) -> str:
        return f"{self.workdir}/.req/leviath-{self.id}"

    def submit(self, script: str) -> int:
        self.n += 1
        n = self.n
        self.bed.run(["sh", "-c", f"mkdir -p {self.dir} && cd {self.dir} && cat > {n}.tmp && "
                      f"mv {n}.tmp {n}.sh"], user=self.user, cwd=self.workdir, input=script)
        return n

    def result(self, n: int, timeout: float | None = None) -> tuple[int, str, str]:
        self.bed.run(["sh", "-c", f"until [ -f {self.dir}/{n}.rc ]; do sleep 0.05; done"],
                     timeout=timeout or self.timeout)
        rd = self.bed.read_file
        base = f"{self.dir}/{n}"
        return int(rd(f"{base}.rc")), rd(f"{base}.out"), rd(f"{base}.err")

    def done(self, n: int) -> bool:
        return self.bed.run(["test", "-f", f"{self.dir}/{n}.rc"], check=False).returncode == 0

    def call(self, script: str, timeout: float | None = None) -> tuple[int, str, str]:
        return self.result(self.submit(script), timeout)


def lay_out(bed: Testbed, workdir: str, blueprint_dir: str, blueprint: str,
            files: dict[str, str] | None = None, user: str = "alice") -> None:
    """As `user`, in her home (every path here is relative to it): the
    workdir with its .req folder and LOOP as loop.sh, the blueprint folder
    holding `blueprint`, and each of `files` (path: text)."""
    home = bed.users[user].home
    bed.run(["sh", "-c", 'mkdir -p "$1/.req" "$2" && cat > "$2/blueprint.toml"', "lay_out",
             workdir, blueprint_dir], user=user, cwd=home, input=blueprint)
    for path, text in {f"{workdir}/loop.sh": LOOP, **(files or {})}.items():
        bed.run(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "lay_out", path],
                user=user, cwd=home, input=text)


def start_detached(bed: Testbed, blueprint_dir: str, workdir: str, user: str = "alice") -> str:
    """`lev run --detach BLUEPRINT` as `user` in `workdir` (both relative to
    her home): the new agent's id."""
    home = bed.users[user].home
    out = str(bed.run(["lev", "run", "--detach", f"{home}/{blueprint_dir}"], user=user,
                      cwd=f"{home}/{workdir}").stdout).strip()
    assert len(out) == 8 and all(c in "0123456789abcdef" for c in out), out
    return out
