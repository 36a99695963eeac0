"""lev runs as `python3 -IS` and runs `site` only on demand (cli/lazysite.py).
A user plants modules named like what lev imports (stdlib, pydantic, the
`site` hooks) in a folder, in their user site folder (a .pth line too) and
in PYTHON* variables; root (an admin) then runs lev there with that
environment, including commands whose imports run `site` late. None of the
planted code may run. Red team, this round: it held; kept as the attacker's
check."""

from __future__ import annotations

from testbed import Testbed

PLANTED = ("json", "enum", "re", "pydantic", "dbus_fast", "sitecustomize", "usercustomize",
           "leviathd", "tomllib", "typing", "argparse", "inotify_simple", "pystemd")
MARK = "/tmp/lev-planted-ran"


def test_lev_run_by_root_in_a_users_folder_imports_none_of_their_code(testbed: Testbed) -> None:
    bed = testbed
    home = bed.users["alice"].home
    trap = f"{home}/trap"
    py = f"open({MARK!r}, 'a').write(__name__ + chr(10))\n"
    user_site = f"{home}/.local/lib/python3.13/site-packages"
    bed.run(["mkdir", "-p", trap, f"{trap}/startup", user_site], user="alice")
    for name in PLANTED:
        bed.write_file(f"{trap}/{name}.py", py)
        bed.write_file(f"{trap}/startup/{name}.py", py)
        bed.write_file(f"{user_site}/{name}.py", py)
    bed.write_file(f"{user_site}/zz.pth", f"import sys; exec({py!r})\n")
    bed.write_file(f"{trap}/zz.pth", f"import sys; exec({py!r})\n")
    bed.run(["chown", "-R", "alice:", trap, f"{home}/.local"])
    bed.run(["rm", "-f", MARK])
    env = {"PYTHONPATH": f"{trap}/startup", "PYTHONSTARTUP": f"{trap}/json.py",
           "PYTHONHOME": trap, "PYTHONUSERBASE": f"{home}/.local", "HOME": home,
           "PYTHONINSPECT": "1", "PYTHONSAFEPATH": ""}
    for cmd in (["lev", "ps"], ["lev", "--help"], ["lev", "validate"],
                ["lev", "policy", "show"], ["lev", "agent", "store", "list"]):
        for who in (None, "alice"):
            r = bed.run(cmd, user=who, cwd=trap, env=env, check=False)
            # validate and policy show import pydantic: site ran late, and still
            # found the real one.
            assert "No module named" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    ran = bed.run(["cat", MARK], check=False).stdout
    assert ran == "", ran
    # The plant is live: the same interpreter without -IS runs it (the old
    # wrapper's `#!python` line; seen so here), so the check above can fail.
    bed.run(["/opt/leviath-dev/venv/bin/python", "-c", "import json"], cwd=trap,
            env={"PYTHONPATH": f"{trap}/startup"}, check=False)
    assert "json" in bed.run(["cat", MARK], check=False).stdout
