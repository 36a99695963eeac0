"""Credentials injected at the egress (issue 30): a git clone of a ~50 MB
repository over HTTPS through the proxy's injection (TLS ended by the
daemon with the agent's leaf, the token put in, a new TLS connection to the
server verified against the server's CA) against the same clone with the
token configured directly in git, in one run, alternated, best of ROUNDS.

    PYTHONPATH=. /opt/leviath-dev/venv/bin/python bench/inject_bench.py

The server is `git http-backend` behind a TLS server on this machine's
loopback (a port the proxy opens with host_ports, as `localhost`); the
server, the proxy and the forwarder each run in a process of their own.
Prints the two times and the ratio (goal: <= 1.3x).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import http.server
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from leviathd.domain.sensitivity import Sensitivity
from leviathd.proxy import inject
from leviathd.proxy.ca import AgentCA
from leviathd.proxy.policy import ProxySettings
from leviathd.proxy.server import Agent, Injector, ProxyServer

SIZE = 50 << 20
ROUNDS = 3
TOKEN = "bench-token-0123456789"
USER = "x-access-token"


def in_child(fn: Callable[[], None]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            fn()
        finally:
            os._exit(0)
    return pid


def make_certs(d: Path) -> None:
    def cert(name: str, key: ec.EllipticCurvePrivateKey, issuer_key: ec.EllipticCurvePrivateKey,
             issuer: x509.Name | None, ca: bool) -> x509.Certificate:
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer or subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(days=1))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]),
                                critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = cert("bench ca", ca_key, ca_key, None, True)
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = cert("localhost", key, ca_key, ca.subject, False)
    pem = serialization.Encoding.PEM
    (d / "ca.pem").write_bytes(ca.public_bytes(pem))
    (d / "server.pem").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()) + leaf.public_bytes(pem))


def make_repo(d: Path) -> None:
    src = d / "src"
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True)
    (src / "blob").write_bytes(os.urandom(SIZE))  # incompressible: the pack is ~SIZE
    subprocess.run(["git", "-C", str(src), "add", "blob"], check=True)
    subprocess.run(["git", "-C", str(src), "-c", "user.name=b", "-c", "user.email=b@b",
                    "commit", "-q", "-m", "one"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(d / "root" / "repo.git")],
                   check=True)


def serve(d: Path, sock: socket.socket) -> None:
    good = "Basic " + base64.b64encode(f"{USER}:{TOKEN}".encode()).decode()

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle_one(self) -> None:
            if self.headers.get("Authorization") != good:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="b"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path, _, query = self.path.partition("?")
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            env = {"GIT_PROJECT_ROOT": str(d / "root"), "GIT_HTTP_EXPORT_ALL": "1",
                   "REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query,
                   "CONTENT_TYPE": self.headers.get("Content-Type", ""), "REMOTE_USER": "b",
                   "REMOTE_ADDR": "127.0.0.1", "PATH": "/usr/bin:/bin",
                   "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                   "GIT_PROTOCOL": self.headers.get("Git-Protocol", "")}
            out = subprocess.run(["git", "http-backend"], input=body, env=env,
                                 capture_output=True).stdout
            head, _, rest = out.partition(b"\r\n\r\n")
            status, headers = 200, []
            for line in head.decode().splitlines():
                k, _, v = line.partition(":")
                if k.lower() == "status":
                    status = int(v.split()[0])
                elif k:
                    headers.append((k, v.strip()))
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(rest)))
            self.end_headers()
            self.wfile.write(rest)

        do_GET = do_POST = handle_one

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H, bind_and_activate=False)
    srv.socket.close()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(d / "server.pem"))
    srv.socket = ctx.wrap_socket(sock, server_side=True)
    srv.serve_forever()


def run_proxy(d: Path, port: int, listener: socket.socket) -> None:
    async def go() -> None:
        inj = inject.Injection(name="b", kind="git", hosts=(f"localhost:{port}",),
                               placeholder=inject.placeholder(b"k" * 32, "b"), username=USER)
        ca = AgentCA("bench", inj.hosts)
        (d / "agentca.pem").write_bytes(ca.pem)

        async def secret(_name: str) -> str:
            return TOKEN

        agent = Agent(id="bench", user="b", uid=os.getuid(), gid=os.getgid(),
                      taint=lambda: Sensitivity.PUBLIC, approvals=lambda: None,
                      is_own=lambda _cg: True)
        upstream = ssl.create_default_context(cafile=str(d / "ca.pem"))
        server = ProxyServer(agent, ProxySettings(host_ports=(port,)), str(d / "proxy.sock"),
                             lambda _r: None, Injector(ca=ca, injections=(inj,), secret=secret,
                                                       push="allow", upstream=upstream))
        await server.start()
        server.adopt(listener)
        await asyncio.Event().wait()

    asyncio.run(go())


def clone(d: Path, url: str, env: dict[str, str], *config: str) -> float:
    dest = d / "out"
    shutil.rmtree(dest, ignore_errors=True)
    args = [a for c in config for a in ("-c", c)]
    t = time.perf_counter()
    subprocess.run(["git", *args, "clone", "-q", url, str(dest)], check=True,
                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(d),
                        "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", **env})
    return time.perf_counter() - t


def main() -> int:
    d = Path(tempfile.mkdtemp(prefix="inject-bench-"))
    pids: list[int] = []
    try:
        make_certs(d)
        make_repo(d)
        ssock = socket.create_server(("127.0.0.1", 0))
        port = ssock.getsockname()[1]
        pids.append(in_child(lambda: serve(d, ssock)))
        ssock.close()
        lsock = socket.create_server(("127.0.0.1", 0))
        pport = lsock.getsockname()[1]
        pids.append(in_child(lambda: run_proxy(d, port, lsock)))
        lsock.close()
        while not (d / "agentca.pem").exists():
            time.sleep(0.05)
        url = f"https://localhost:{port}/repo.git"
        basic = base64.b64encode(f"{USER}:{TOKEN}".encode()).decode()
        ph = inject.placeholder(b"k" * 32, "b")
        basic_ph = base64.b64encode(f"{USER}:{ph}".encode()).decode()
        direct, through = [], []
        for _ in range(ROUNDS):
            direct.append(clone(d, url, {"GIT_SSL_CAINFO": str(d / "ca.pem")},
                                f"http.extraHeader=Authorization: Basic {basic}"))
            through.append(clone(d, url, {"GIT_SSL_CAINFO": str(d / "agentca.pem"),
                                          "https_proxy": f"http://127.0.0.1:{pport}"},
                                 f"http.extraHeader=Authorization: Basic {basic_ph}"))
        best_d, best_t = min(direct), min(through)
        print(f"clone of {SIZE >> 20} MiB over https, best of {ROUNDS}:")
        print(f"  token in git directly: {best_d:.2f} s  (all: "
              f"{', '.join(f'{x:.2f}' for x in direct)})")
        print(f"  through the injection: {best_t:.2f} s  (all: "
              f"{', '.join(f'{x:.2f}' for x in through)})")
        print(f"  ratio: {best_t / best_d:.2f}x (goal <= 1.3x); load average "
              f"{os.getloadavg()[0]:.1f}")
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
