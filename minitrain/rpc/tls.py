"""Per-run TLS between hosts (L1): a self-signed certificate made at start, pinned by every client.

The driver makes one EC P-256 key and a self-signed certificate per run (`new_run_identity`), in
memory only: the key is never written to disk, put on a command line or sent anywhere. The
coordinator serves TLS with it on every address that is not loopback (`uses_tls`). Agents receive
the certificate (its public part) on their stdin after the run token, workers in their bootstrap
line from their agent, and both trust that one certificate and nothing else
(`channel_credentials`): a peer that cannot present this run's key cannot be the coordinator, and
nobody on the wire reads the token.

Loopback stays plaintext: it never leaves the machine, and only root can read it there. Making the
identity costs about a millisecond (EC key generation and one signature), so TLS adds nothing
noticeable to a multi-host start.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass, field
from typing import Optional, Sequence

import grpc

# The certificate's common name. Clients check the address they dial against its IP SANs.
COMMON_NAME = "minitrain coordinator"
# The key dies with the driver, so validity limits little; it must outlast any run, because an
# agent relaunched late in a long run still checks it. Not-before is an hour back for clock skew.
VALIDITY = datetime.timedelta(days=365)
CLOCK_SKEW = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class RunIdentity:
    """One run's certificate (PEM, public) and private key (PEM; held in the driver's memory only)."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)


def uses_tls(host: str) -> bool:
    """True when connections to `host` (an address or a name) are TLS: anything but loopback.

    The server and every client decide with this one rule, so they always agree.
    """
    host = host.strip("[]")
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a host name: assume it crosses the network


def is_local_socket(address: str) -> bool:
    """True for a Unix socket address ("unix:/path"): plaintext, it never leaves the machine (the run
    token still authenticates every call on it)."""
    return address.startswith("unix:")


def host_of(address: str) -> str:
    """The host part of `host:port` (`[v6]:port` too)."""
    return address.rsplit(":", 1)[0].strip("[]")


def new_run_identity(hosts: Sequence[str]) -> RunIdentity:
    """A fresh EC P-256 key and a self-signed certificate whose subject alternative names are `hosts`
    (the coordinator's bind addresses: IP addresses, or DNS names for host names)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(h.strip("[]") for h in hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return RunIdentity(cert.public_bytes(serialization.Encoding.PEM), key_pem)


def server_credentials(identity: RunIdentity) -> grpc.ServerCredentials:
    """TLS credentials for the coordinator's non-loopback ports (no client certificates: clients
    authenticate with the run token, which TLS now keeps secret)."""
    return grpc.ssl_server_credentials([(identity.key_pem, identity.cert_pem)])


def channel_credentials(cert_pem: bytes) -> grpc.ChannelCredentials:
    """Client credentials that trust exactly `cert_pem` (this run's certificate) and no CA; the
    address dialled must be one of its subject alternative names."""
    return grpc.ssl_channel_credentials(root_certificates=cert_pem)


def require_cert(address: str, cert_pem: Optional[bytes]) -> None:
    """Raise ValueError when `address` needs TLS (not loopback) and no certificate was given: a
    client never falls back to plaintext where the server speaks TLS. A Unix socket needs none."""
    if not is_local_socket(address) and uses_tls(host_of(address)) and not cert_pem:
        raise ValueError(f"the coordinator at {address} is reached over the network and speaks TLS, "
                         "but no run certificate was given; agents get it on stdin after the token")


# A joined run's identity is derived from its token: label of the derivation (changing it changes
# every joined run's certificate) and the fixed validity of the derived certificate, which must be the
# same bytes on every host that derives it.
_JOIN_KDF_INFO = b"minitrain join tls identity v1"
_JOIN_NOT_BEFORE = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
_JOIN_NOT_AFTER = datetime.datetime(2100, 1, 1, tzinfo=datetime.timezone.utc)


def join_identity(token: str, host: str) -> RunIdentity:
    """The TLS identity of a run whose agents join by themselves: derived from the run `token` and the
    `host` the joiners dial (its one subject alternative name), so that the coordinator and every
    joiner compute the same certificate, byte for byte, from the one secret they share.

    Why derived and not shipped: a joiner has no driver to hand it the certificate on stdin, and
    wherever joiners run (a Kubernetes Secret mounted on every pod, a file on a shared disk) whoever
    can read the token could read a separate key beside it, so a second secret would add setup and no
    boundary. An eavesdropper without the token can neither read it (TLS) nor pose as the coordinator
    (the key is HKDF-SHA256 of the token); whoever holds the token can, exactly as they can join. The
    signature is deterministic (RFC 6979) so the certificate's bytes do not vary between hosts.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    from cryptography.x509.oid import NameOID

    host = host.strip("[]")
    seed = HKDF(algorithm=hashes.SHA256(), length=48, salt=None,
                info=_JOIN_KDF_INFO).derive(token.encode())
    order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # P-256's group order
    key = ec.derive_private_key(int.from_bytes(seed, "big") % (order - 1) + 1, ec.SECP256R1())
    try:
        name: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        name = x509.DNSName(host)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)])
    serial = int.from_bytes(seed[:16], "big") >> 1 or 1  # positive, at most 127 bits
    cert = (x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(_JOIN_NOT_BEFORE)
            .not_valid_after(_JOIN_NOT_AFTER)
            .add_extension(x509.SubjectAlternativeName([name]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256(), ecdsa_deterministic=True))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return RunIdentity(cert.public_bytes(serialization.Encoding.PEM), key_pem)
