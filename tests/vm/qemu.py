"""Boot the cached Debian 13 machine (tests/vm/image.py) once under QEMU.

The disk is opened with snapshot=on: the cached image is never written, every
boot starts from the same machine. The 9p share `host` carries the .deb and
scripts in and results/ out. KVM is tried first when /dev/kvm is usable and
abandoned on its "KVM internal error" (nested virtualisation on these hosts);
TCG is the fallback, or the choice with LEVIATH_VM_ACCEL=tcg.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

KVM_FAILURE = ("KVM internal error", "emulation failure", "failed to initialize kvm",
               "Could not access KVM")


@dataclass
class Boot:
    accel: str
    seconds: float
    returncode: int | None
    console: Path
    notes: list[str]


def accelerators() -> list[str]:
    forced = os.environ.get("LEVIATH_VM_ACCEL")
    if forced:
        return [forced]
    if os.access("/dev/kvm", os.R_OK | os.W_OK):
        return ["kvm", "tcg"]
    return ["tcg"]


def command(machine: Path, share: Path, console: Path, accel: str) -> list[str]:
    # TCG runs the vCPUs in one host thread: with a thread each (MTTCG) the
    # guest kernel's own code patching (static keys, patched through int3)
    # raced the other vCPU's stale translation once and the guest panicked
    # ("Oops: int3" in update_curr, Debian 12's QEMU 7.2); and the VM shares
    # the 2-core host with the rest of the suite anyway (tests/conftest.py
    # boots it while the other tests run).
    cpu = ["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else [
        "-accel", "tcg,thread=single", "-cpu", "max"]
    return [
        "qemu-system-x86_64", *cpu,
        "-m", os.environ.get("LEVIATH_VM_MEMORY", "2048"),
        "-smp", os.environ.get("LEVIATH_VM_CPUS", "2"),
        "-nodefaults", "-no-reboot", "-display", "none", "-monitor", "none",
        "-serial", f"file:{console}",
        "-kernel", str(machine / "vmlinuz"), "-initrd", str(machine / "initrd.img"),
        "-append", "root=/dev/vda rw console=ttyS0 panic=-1 loglevel=4 "
                   "systemd.show_status=0 systemd.unified_cgroup_hierarchy=1",
        "-drive", f"file={machine / 'disk.img'},format=raw,if=virtio,snapshot=on",
        "-virtfs", f"local,path={share},mount_tag=host,security_model=none,id=host",
        "-device", "virtio-rng-pci",
    ]


# Set when the pytest session ends: a VM still running (the session was
# interrupted, its checks run in a thread: tests/vm/early.py) is killed.
STOP = threading.Event()

# The guest's mount of the share raced the virtio 9p device once under TCG
# ("9pnet_virtio: no channels available for device host"): the machine then
# powers off before inside.sh runs. Such a boot is tried once more.
SHARE_MISSING = "special device host does not exist"


def run(machine: Path, share: Path, timeout: float) -> Boot:
    """Boot, let inside.sh run, wait for the power-off. Falls back from KVM to
    TCG when KVM fails before the guest has reported anything; boots once more
    when the guest could not mount the share."""
    boot = _run(machine, share, timeout)
    if not (share / "results" / "boot.out").exists() and SHARE_MISSING in boot.console.read_text(
            errors="replace"):
        boot.console.rename(boot.console.with_suffix(".first.log"))
        notes = [*boot.notes, "the guest could not mount the share: booted again"]
        boot = _run(machine, share, timeout)
        boot.notes[:0] = notes
    return boot


def _run(machine: Path, share: Path, timeout: float) -> Boot:
    notes: list[str] = []
    boot: Boot | None = None
    for accel in accelerators():
        console = share / f"console-{accel}.log"
        stderr_path = share / f"qemu-{accel}.stderr"
        results = share / "results"
        t0 = time.monotonic()
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(command(machine, share, console, accel),
                                    stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout:
                    notes.append(f"{accel}: no power-off within {timeout:.0f}s; killed")
                    break
                if STOP.is_set():
                    notes.append(f"{accel}: the test session ended first; killed")
                    break
                if accel == "kvm" and not (results / "boot.out").exists():
                    text = stderr_path.read_text(errors="replace")
                    if any(s in text for s in KVM_FAILURE):
                        notes.append(f"kvm failed: {text.strip().splitlines()[0][:200]}")
                        break
                time.sleep(1)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        boot = Boot(accel, time.monotonic() - t0, proc.returncode, console, notes)
        if (results / "boot.out").exists() or accel == "tcg":
            return boot
        notes.append(f"{accel}: exited {proc.returncode} before the guest booted; "
                     + stderr_path.read_text(errors="replace")[-300:])
        for f in results.glob("*") if results.is_dir() else []:
            f.unlink()
    assert boot is not None
    return boot
