"""One agent's certificate authority, for the hosts its credentials cover
(issue 30): the proxy terminates TLS toward those hosts only, with a leaf
certificate this CA signs, so that it can put the secret into the request.

The key is made in the daemon's memory when the agent starts and never
written anywhere; the agent's sandbox gets only the certificate (in a
bundle with the system's CAs, proxy/trust.py). The CA is name-constrained
to the covered hosts: even a leaf for another name, were one ever made,
would not verify. A daemon restart makes a new CA and writes the bundle
again (clients read it when they start). Gone with the agent: nothing of it
outlives the ProxyServer that holds it.

Key generation and signing run in a worker thread (`leaf_context` is called
through asyncio.to_thread): an EC P-256 key takes about a millisecond, but a
burst of new host names must not hold the event loop.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import threading
from collections.abc import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Leaves are cached per host; a bounded number of covered names.
MAX_LEAVES = 256
_DAY = datetime.timedelta(days=1)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common[:64])])


def constraint_names(patterns: Iterable[str]) -> list[str]:
    """The DNS names the CA may sign for: a pattern's host part, with
    `*.example.com` as `example.com` (a name constraint covers what is below
    it). Glob characters other than a leading `*.` cannot be expressed: such
    a pattern is left out (its hosts get no injection)."""
    names: list[str] = []
    for p in patterns:
        host = p.partition(":")[0].lower()
        if host.startswith("*."):
            host = host[2:]
        if not host or any(c in host for c in "*?[]"):
            continue
        try:
            ipaddress.ip_address(host)
            continue  # addresses are never intercepted (proxy/server.py)
        except ValueError:
            pass
        if host not in names:
            names.append(host)
    return names


class AgentCA:
    def __init__(self, agent_id: str, hosts: Iterable[str]) -> None:
        self.names = constraint_names(hosts)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = _name(f"leviathd agent {agent_id}")
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY).not_valid_after(now + 365 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()),
                           critical=False)
        )
        # Always constrained: with no name to cover, to `invalid` (RFC 6761),
        # which nothing is.
        builder = builder.add_extension(x509.NameConstraints(
            permitted_subtrees=[x509.DNSName(n) for n in self.names or ["invalid"]],
            excluded_subtrees=None), critical=True)
        self.cert = builder.sign(self._key, hashes.SHA256())
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)
        self._leaves: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()

    def covers(self, host: str) -> bool:
        return any(host == n or host.endswith("." + n) for n in self.names)

    def leaf_context(self, host: str) -> ssl.SSLContext:
        """A server-side TLS context with a leaf for `host` only (blocking:
        call it in a thread)."""
        with self._lock:
            ctx = self._leaves.get(host)
        if ctx is not None:
            return ctx
        if not self.covers(host):
            raise ValueError(f"{host} is not a name this agent's CA signs for")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            raise ValueError("no leaf for an IP address")
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        leaf = (
            x509.CertificateBuilder()
            .subject_name(_name(host)).issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY).not_valid_after(now + 30 * _DAY)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        # load_cert_chain takes a file name only: a memfd of the daemon's,
        # by its /proc/self/fd name (no file system entry anyone could reach).
        fd = os.memfd_create("leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())
                     + leaf.public_bytes(serialization.Encoding.PEM))
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        with self._lock:
            if len(self._leaves) >= MAX_LEAVES:
                self._leaves.pop(next(iter(self._leaves)))
            self._leaves[host] = ctx
        return ctx
