"""The daemon's figures (leviathd/metrics.py, metricsfile.py; issue 46): the
text parses with a real OpenMetrics parser (Debian's python3-prometheus-client),
stays bounded whatever names users bring, and root writes the file only into
a folder that is root's alone."""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from leviathd import metrics, metricsfile


def _parsed(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_the_text_is_openmetrics_with_counters_gauges_and_units() -> None:
    reg = metrics.Registry()
    starts = reg.family("starts", "counter", "Starts.")
    refusals = reg.family("refusals", "counter", "Refusals.", ("layer",))
    nbytes = reg.family("proxy", "counter", "Bytes.", ("direction",), unit="bytes")
    starts.inc()
    starts.inc()
    refusals.inc("polkit")
    nbytes.inc("sent", by=1234)
    running = metrics.running_family([("alice", "namespace"), ("alice", "namespace"),
                                      ("bob", "container")])
    got = _parsed(metrics.render([*reg.snapshot(), running, *metrics.process_families()]))
    assert got["leviathd_starts_total"] == {(): 2}
    assert got["leviathd_refusals_total"] == {(("layer", "polkit"),): 1}
    assert got["leviathd_proxy_bytes_total"] == {(("direction", "sent"),): 1234}
    assert got["leviathd_agents_running"] == {
        (("kind", "namespace"), ("user", "alice")): 2, (("kind", "container"), ("user", "bob")): 1}
    assert got["leviathd_open_fds"][()] > 0
    assert got["leviathd_resident_memory_bytes"][()] > 1 << 20


def test_label_values_users_choose_are_escaped_and_cut() -> None:
    reg = metrics.Registry()
    fam = reg.family("injected_requests", "counter", "Injected.", ("credential",))
    odd = 'a"b\\c\nd} e{' + "x" * 500
    fam.inc(odd)
    text = metrics.render(reg.snapshot())
    assert len(text.splitlines()) == 4  # TYPE, HELP, one sample, EOF: no line the value made
    (labels,) = _parsed(text)["leviathd_injected_requests_total"]
    assert dict(labels)["credential"] == odd[:metrics.MAX_LABEL_VALUE]
    (row,) = metrics.rows(reg.snapshot())  # `lev stats --json`: the same sample
    assert row == {"name": "leviathd_injected_requests_total",
                   "labels": {"credential": odd[:metrics.MAX_LABEL_VALUE]}, "value": 1}


def test_label_sets_are_bounded_and_the_total_kept() -> None:
    fam = metrics.Family("agents_running", "gauge", "Running.", ("user", "kind"))
    for n in range(10_000):
        fam.inc(f"user{n}", "namespace")
    assert len(fam.values) == metrics.MAX_LABEL_SETS
    assert sum(fam.values.values()) == 10_000
    assert fam.values[(metrics.OTHER, metrics.OTHER)] == 10_000 - (metrics.MAX_LABEL_SETS - 1)
    assert len(metrics.render([fam]).encode()) < 20_000


def test_the_file_is_replaced_atomically_readable_by_node_exporter_only(tmp_path: Path) -> None:
    folder = tmp_path / "textfile"
    folder.mkdir(mode=0o755)
    path = str(folder / "leviathd.prom")
    metricsfile.write(path, metrics.REGISTRY.snapshot())
    assert "leviathd_starts_total" in _parsed(Path(path).read_text())
    st = os.stat(path)
    try:
        reader = grp.getgrnam(metricsfile.READER_GROUP).gr_gid
    except KeyError:  # no node exporter here: nobody's to hide it from
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o644)
    else:  # node exporter's group reads it, other local users do not
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, reader, 0o640)
    assert sorted(os.listdir(folder)) == ["leviathd.prom"]  # no temporary file left


def test_root_writes_no_metrics_into_a_folder_someone_else_can_write(tmp_path: Path) -> None:
    assert os.geteuid() == 0, "run as root, like CI (the write is root's)"
    folder = tmp_path / "textfile"
    folder.mkdir(mode=0o755)
    os.chown(folder, 65534, 65534)  # nobody's: a place nobody but nobody may fill
    with pytest.raises(metricsfile.MetricsFolderRefused):
        metricsfile.write(str(folder / "leviathd.prom"), [])
    os.chown(folder, 0, 0)
    os.chmod(folder, 0o777)  # root's, but anyone may swap entries in it
    with pytest.raises(metricsfile.MetricsFolderRefused):
        metricsfile.write(str(folder / "leviathd.prom"), [])
    assert os.listdir(folder) == []
