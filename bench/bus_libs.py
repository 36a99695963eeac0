"""The daemon's bus library, measured (issue 24 §1): dbus-fast (as shipped, and
with leviathd's write-path fix), python-sdbus (sd-bus) and jeepney, on a private
dbus-daemon: import time, call latency, 1,000 calls, and a 2 MB reply served
while other calls are answered at the same time.

Needs all three libraries, which the project's venv does not have (sdbus and
jeepney are not dependencies); use a separate venv for the bench only:

    python3 -m venv /tmp/busbench-venv
    /tmp/busbench-venv/bin/pip install sdbus==0.14.3 jeepney==0.9.0 dbus-fast
    PYTHONPATH=. /tmp/busbench-venv/bin/python bench/bus_libs.py [--seconds 15]

Each measurement runs in a fresh process. The load in the 2 MB case: 4
connections asking for the 2 MB reply in a loop and 8 asking for a small one,
all against one server process in the library under test; a library that
drops its connection shows as a dead server and failed calls.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time

BIG = 2 * 1024 * 1024
NAME = "org.leviath.Bench"
PATH = "/org/leviath/Bench"
IFACE = "org.leviath.Bench"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

IMPORTS = {
    "dbus-fast": "import dbus_fast.aio",
    "dbus-fast+fix": "import dbus_fast.aio",
    "sdbus": "import sdbus",
    "jeepney": "import jeepney.io.asyncio",
    "jeepney (blocking)": "import jeepney.io.blocking",
}


# --- clients: latency and 1,000 calls to the bus daemon itself (GetId) -----

async def _dbus_fast_calls(n: int, concurrent: bool) -> list[float]:
    from dbus_fast import Message
    from dbus_fast.aio import MessageBus

    bus = await MessageBus(bus_address=os.environ["DBUS_SESSION_BUS_ADDRESS"]).connect()

    def msg() -> Message:
        return Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                       interface="org.freedesktop.DBus", member="GetId")

    return await _timed(lambda: bus.call(msg()), n, concurrent)


async def _sdbus_calls(n: int, concurrent: bool) -> list[float]:
    import sdbus
    from sdbus import DbusInterfaceCommonAsync, dbus_method_async

    class Daemon(DbusInterfaceCommonAsync, interface_name="org.freedesktop.DBus"):  # type: ignore[misc,call-arg]
        @dbus_method_async(result_signature="s")  # type: ignore[misc]
        async def get_id(self) -> str:
            raise NotImplementedError

    sdbus.set_default_bus(sdbus.sd_bus_open_user())
    proxy = Daemon.new_proxy("org.freedesktop.DBus", "/org/freedesktop/DBus")
    return await _timed(proxy.get_id, n, concurrent)


async def _jeepney_calls(n: int, concurrent: bool) -> list[float]:
    from jeepney import DBusAddress, new_method_call
    from jeepney.io.asyncio import open_dbus_router

    addr = DBusAddress("/org/freedesktop/DBus", bus_name="org.freedesktop.DBus",
                       interface="org.freedesktop.DBus")
    async with open_dbus_router(bus="SESSION") as router:
        return await _timed(
            lambda: router.send_and_get_reply(new_method_call(addr, "GetId")), n, concurrent
        )


def _jeepney_blocking_calls(n: int) -> list[float]:
    from jeepney import DBusAddress, new_method_call
    from jeepney.io.blocking import open_dbus_connection

    addr = DBusAddress("/org/freedesktop/DBus", bus_name="org.freedesktop.DBus",
                       interface="org.freedesktop.DBus")
    conn = open_dbus_connection(bus="SESSION")
    out = []
    for _ in range(n):
        t = time.perf_counter()
        conn.send_and_get_reply(new_method_call(addr, "GetId"))
        out.append(time.perf_counter() - t)
    conn.close()
    return out


async def _timed(call, n: int, concurrent: bool) -> list[float]:  # type: ignore[no-untyped-def]
    async def one() -> float:
        t = time.perf_counter()
        await call()
        return time.perf_counter() - t

    await one()  # connection set-up and first-call costs are not the subject
    if concurrent:
        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return [time.perf_counter() - t0]
    return [await one() for _ in range(n)]


def client_main(lib: str, n: int, concurrent: bool) -> None:
    if lib == "jeepney (blocking)":
        result = _jeepney_blocking_calls(n)
    else:
        if lib == "dbus-fast+fix":
            _install_fix()
        fn = {"dbus-fast": _dbus_fast_calls, "dbus-fast+fix": _dbus_fast_calls,
              "sdbus": _sdbus_calls, "jeepney": _jeepney_calls}[lib]
        result = asyncio.run(fn(n, concurrent))
    print(" ".join(f"{x:.9f}" for x in result))


def _install_fix() -> None:
    sys.path.insert(0, HERE)
    from leviathd.bus import writer

    writer.install()


# --- servers for the 2 MB case ---------------------------------------------

def server_main(lib: str) -> None:
    payload = "x" * BIG
    if lib.startswith("dbus-fast"):
        if lib == "dbus-fast+fix":
            _install_fix()
        from dbus_fast.aio import MessageBus
        from dbus_fast.service import ServiceInterface, dbus_method

        class Bench(ServiceInterface):
            def __init__(self) -> None:
                super().__init__(IFACE)

            @dbus_method()
            async def Big(self) -> s:  # type: ignore[name-defined]  # noqa: F821
                return payload

            @dbus_method()
            async def Small(self) -> s:  # type: ignore[name-defined]  # noqa: F821
                return "x"

        async def serve() -> None:
            bus = await MessageBus(bus_address=os.environ["DBUS_SESSION_BUS_ADDRESS"]).connect()
            bus.export(PATH, Bench())
            await bus.request_name(NAME)
            print("ready", flush=True)
            await bus.wait_for_disconnect()

        asyncio.run(serve())
        sys.exit(3)  # the connection is gone: that is the failure measured
    import sdbus
    from sdbus import DbusInterfaceCommonAsync, dbus_method_async

    class SdBench(DbusInterfaceCommonAsync, interface_name=IFACE):  # type: ignore[misc,call-arg]
        @dbus_method_async(result_signature="s", method_name="Big")  # type: ignore[misc]
        async def big(self) -> str:
            return payload

        @dbus_method_async(result_signature="s", method_name="Small")  # type: ignore[misc]
        async def small(self) -> str:
            return "x"

    async def serve_sd() -> None:
        sdbus.set_default_bus(sdbus.sd_bus_open_user())
        await sdbus.request_default_bus_name_async(NAME)
        obj = SdBench()
        obj.export_to_dbus(PATH)
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve_sd())


async def _load(seconds: float) -> dict[str, float]:
    from dbus_fast import Message
    from dbus_fast.aio import MessageBus

    address = os.environ["DBUS_SESSION_BUS_ADDRESS"]
    stats = {"big_ok": 0.0, "small_ok": 0.0, "failed": 0.0}
    big_times: list[float] = []
    deadline = time.monotonic() + seconds

    async def worker(member: str) -> None:
        bus = await MessageBus(bus_address=address).connect()
        while time.monotonic() < deadline:
            t = time.perf_counter()
            try:
                reply = await asyncio.wait_for(bus.call(Message(
                    destination=NAME, path=PATH, interface=IFACE, member=member)), 30)
                ok = reply.message_type.name == "METHOD_RETURN"
            except Exception:
                ok = False
            if not ok:
                stats["failed"] += 1
                await asyncio.sleep(0.05)
                continue
            if member == "Big":
                stats["big_ok"] += 1
                big_times.append(time.perf_counter() - t)
            else:
                stats["small_ok"] += 1
        bus.disconnect()

    await asyncio.gather(*(worker("Big") for _ in range(4)), *(worker("Small") for _ in range(8)))
    stats["big_p50_ms"] = statistics.median(big_times) * 1000 if big_times else float("nan")
    return stats


def load_main(seconds: float) -> None:
    stats = asyncio.run(_load(seconds))
    print(" ".join(f"{k}={v}" for k, v in stats.items()))


# --- the driver ------------------------------------------------------------

class ChildFailed(Exception):
    pass


def _child(args: list[str], env: dict[str, str], timeout: float = 300) -> str:
    out = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True,
                         text=True, timeout=timeout)
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        raise ChildFailed(lines[-1] if lines else f"exit status {out.returncode}")
    return out.stdout.strip()


def _ms_or_failure(args: list[str], env: dict[str, str]) -> str:
    try:
        return f"{float(_child(args, env)) * 1000:.0f}"
    except ChildFailed as exc:
        return f"**fails**: {str(exc)[:60]}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--mode", default="")
    ap.add_argument("--lib", default="")
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--concurrent", action="store_true")
    a = ap.parse_args()
    if a.mode == "client":
        return client_main(a.lib, a.n, a.concurrent)
    if a.mode == "server":
        return server_main(a.lib)
    if a.mode == "load":
        return load_main(a.seconds)

    tmp = tempfile.mkdtemp(prefix="busbench-")
    sock = os.path.join(tmp, "bus")
    daemon = subprocess.Popen(
        ["dbus-daemon", "--session", "--nofork", "--nopidfile", "--print-address",
         f"--address=unix:path={sock}"], stdout=subprocess.PIPE, text=True,
    )
    assert daemon.stdout is not None
    address = daemon.stdout.readline().strip()
    env = dict(os.environ, DBUS_SESSION_BUS_ADDRESS=address)
    try:
        print("| library | import (ms, median of 5) | call latency p50 (µs) | 1,000 calls "
              "sequential (ms) | 1,000 calls concurrent (ms) |")
        print("| --- | --- | --- | --- | --- |")
        for lib, stmt in IMPORTS.items():
            imports = []
            for _ in range(5):
                out = subprocess.run(
                    [sys.executable, "-c",
                     f"import time; t = time.perf_counter(); {stmt}; "
                     "print(time.perf_counter() - t)"],
                    capture_output=True, text=True, env=env, check=True)
                imports.append(float(out.stdout))
            seq = [float(x) for x in _child(["--mode", "client", "--lib", lib], env).split()]
            if lib == "jeepney (blocking)":
                conc = "-"
            else:
                conc = _ms_or_failure(["--mode", "client", "--lib", lib, "--concurrent"], env)
            print(f"| {lib} | {statistics.median(imports) * 1000:.0f} | "
                  f"{statistics.median(seq) * 1e6:.0f} | {sum(seq) * 1000:.0f} | {conc} |")

        print()
        print(f"2 MB reply under concurrent traffic, {a.seconds:.0f} s (4 connections asking "
              "for 2 MB, 8 for a small reply):")
        print()
        print("| server library | server alive at the end | 2 MB replies | small replies "
              "| failed calls | 2 MB p50 (ms) |")
        print("| --- | --- | --- | --- | --- | --- |")
        for lib in ("dbus-fast", "dbus-fast+fix", "sdbus"):
            server = subprocess.Popen([sys.executable, __file__, "--mode", "server", "--lib", lib],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
            assert server.stdout is not None
            server.stdout.readline()
            out = _child(["--mode", "load", "--seconds", str(a.seconds)], env,
                         timeout=a.seconds + 120)
            stats = dict(kv.split("=") for kv in out.split())
            alive = server.poll() is None
            server.kill()
            server.wait()
            print(f"| {lib} | {'yes' if alive else 'NO'} | {float(stats['big_ok']):.0f} | "
                  f"{float(stats['small_ok']):.0f} | {float(stats['failed']):.0f} | "
                  f"{float(stats['big_p50_ms']):.0f} |")
    finally:
        daemon.terminate()
        daemon.wait()


if __name__ == "__main__":
    main()
