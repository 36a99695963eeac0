"""The daemon's figures in the bed (issue 46): the metrics file lands where
Debian's prometheus-node-exporter looks, parses with a real OpenMetrics
parser (python3-prometheus-client), moves as an agent starts and ends, is
not for every local user to read, and node exporter's textfile collector
(Debian's binary, run in the bed on its loopback) serves it. `lev stats`
gives the same figures to an admin and nothing to a plain user."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from testbed import Testbed

pytestmark = pytest.mark.testbed

FILE = "/var/lib/prometheus/node-exporter/leviathd.prom"  # Debian's textfile folder
EXPORTER_PORT = 9146
SCRAPE = ("import urllib.request; print(urllib.request.urlopen("
          f"'http://127.0.0.1:{EXPORTER_PORT}/metrics', timeout=5).read().decode())")

Figures = dict[str, dict[tuple[tuple[str, str], ...], float]]


def parsed(text: str) -> Figures:
    out: Figures = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def read_file(bed: Testbed) -> Figures:
    r = bed.run(["cat", FILE], check=False)
    return parsed(r.stdout) if r.returncode == 0 and r.stdout.endswith("# EOF\n") else {}


def wait_for(what: str, probe: Callable[[], Figures], ok: Callable[[Figures], bool],
             bound: float = 60) -> Figures:
    # The file is rewritten every `interval` (1 s here): waited for, bounded.
    deadline = time.monotonic() + bound
    while True:
        got = probe()
        if ok(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen within {bound} s: {got}")
        time.sleep(0.5)


def running(fig: Figures, user: str) -> float:
    rows = fig.get("leviathd_agents_running", {})
    return sum(v for k, v in rows.items() if dict(k).get("user") == user)


def starts(fig: Figures) -> float:
    return fig.get("leviathd_starts_total", {}).get((), -1)


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    old = testbed.run(["cat", "/etc/leviath/config.toml"], check=False)
    testbed.run(["mkdir", "-p", "metricsw"], user="alice")
    # Every other setting at its default: the file's place too.
    testbed.write_file("/etc/leviath/config.toml", "[metrics]\ninterval = 1\n")
    testbed.run(["systemctl", "restart", "leviathd"])
    yield testbed
    if old.returncode == 0:
        testbed.write_file("/etc/leviath/config.toml", old.stdout)
    else:
        testbed.run(["rm", "-f", "/etc/leviath/config.toml"])
    testbed.run(["rm", "-f", FILE])
    testbed.run(["systemctl", "restart", "leviathd"])


def test_the_metrics_file_moves_with_agents_and_node_exporter_reads_it(bed: Testbed) -> None:
    before = wait_for("the first metrics file", lambda: read_file(bed), lambda f: starts(f) >= 0)
    alice_before = running(before, "alice")
    mode = bed.run(["stat", "-c", "%U %G %a", FILE]).stdout.split()
    assert mode == ["root", "prometheus", "640"], mode  # node exporter's group, not everyone
    cat = bed.run(["cat", FILE], user="bob", check=False)
    assert cat.returncode != 0 and "leviathd_" not in cat.stdout, cat

    cwd = f"{bed.users['alice'].home}/metricsw"
    agent_id = bed.run(["lev", "run", "--detach", "--", "sleep", "120"], user="alice",
                       cwd=cwd).stdout.strip()
    try:
        during = wait_for("alice's agent running", lambda: read_file(bed),
                          lambda f: running(f, "alice") == alice_before + 1
                          and starts(f) >= starts(before) + 1)
        kinds = {dict(k)["kind"] for k in during["leviathd_agents_running"]
                 if dict(k)["user"] == "alice"}
        assert "namespace" in kinds, during["leviathd_agents_running"]
        assert during["leviathd_open_fds"][()] > 0
        assert during["leviathd_resident_memory_bytes"][()] > 1 << 20

        # The same figures on the bus, for an admin; a plain user reads none.
        plain = bed.run(["lev", "stats"], user="alice", check=False)
        assert plain.returncode != 0 and "leviathd_" not in plain.stdout, plain
        admin = parsed(bed.run(["lev", "stats"], user="dave").stdout)
        assert running(admin, "alice") == alice_before + 1, admin
        rows = json.loads(bed.run(["lev", "stats", "--json"], user="dave").stdout)
        assert sum(r["value"] for r in rows if r["name"] == "leviathd_agents_running"
                   and r["labels"]["user"] == "alice") == alice_before + 1, rows

        # Debian's node exporter, its textfile collector on the default folder.
        exporter = subprocess.Popen(bed.command([
            "/usr/bin/prometheus-node-exporter", "--collector.disable-defaults",
            "--collector.textfile", f"--web.listen-address=127.0.0.1:{EXPORTER_PORT}"]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                r = bed.run(["python3", "-c", SCRAPE], check=False)
                if r.returncode == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            assert r.returncode == 0, r.stderr
            assert "node_textfile_scrape_error 0" in r.stdout, r.stdout
            assert f'node_textfile_mtime_seconds{{file="{FILE}"}}' in r.stdout, r.stdout
            assert 'leviathd_agents_running{kind="namespace",user="alice"}' in r.stdout, r.stdout
        finally:
            exporter.kill()
            exporter.wait()
    finally:
        bed.run(["lev", "stop", agent_id], user="alice", check=False)
    wait_for("alice's agent gone", lambda: read_file(bed),
             lambda f: running(f, "alice") == alice_before)
