"""A local deployment started as docs/flower.md starts one across machines: TLS with a CA of
its own and a server certificate for 127.0.0.1, and node authentication, every SuperNode with
an EC P-384 key in OpenSSH format that `flwr supernode register` announced before it started.

The credentials are made with `cryptography` (a Flower dependency) instead of the docs'
openssl and ssh-keygen, so the test needs no binaries beyond Flower's."""

from __future__ import annotations

import datetime
import ipaddress
import json
import subprocess
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pipeline.flower.local import LocalDeployment


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject, key, issuer, signer, extensions) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA256())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def write_tls(folder: Path) -> None:
    """ca.crt, server.crt (SAN: 127.0.0.1 and localhost) and server.key."""
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = _certificate(
        "fedrc test CA",
        ca_key,
        "fedrc test CA",
        ca_key,
        [(x509.BasicConstraints(ca=True, path_length=None), True)],
    )
    server_key = ec.generate_private_key(ec.SECP384R1())
    names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    server = _certificate(
        "superlink",
        server_key,
        "fedrc test CA",
        ca_key,
        [(x509.SubjectAlternativeName(names), False)],
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "server.crt").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (folder / "server.key").write_bytes(_pem_key(server_key))


def write_node_key(path: Path) -> None:
    """PATH (private) and PATH.pub, as `ssh-keygen -t ecdsa -b 384 -N "" -f PATH` writes them."""
    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    path.with_suffix(".pub").write_bytes(public + b"\n")


class SecureDeployment(LocalDeployment):
    """The SuperLink with `--ssl-*` and `--enable-supernode-auth`; SuperNode i with
    `--root-certificates` and its private key, registered first unless i is in `unregistered`."""

    def __init__(
        self, root: Path, node_configs: list[dict[str, str]], unregistered: set[int] = frozenset()
    ) -> None:
        super().__init__(root, node_configs)
        self.credentials = root / "credentials"
        self.unregistered = unregistered
        write_tls(self.credentials)

    def superlink_security(self) -> list[str]:
        files = {"ca-certfile": "ca.crt", "certfile": "server.crt", "keyfile": "server.key"}
        flags = [(f"--ssl-{flag}", str(self.credentials / name)) for flag, name in files.items()]
        return [*(part for flag in flags for part in flag), "--enable-supernode-auth"]

    def node_key(self, i: int) -> Path:
        return self.credentials / f"node{i}"

    def node_security(self, i: int) -> list[str]:
        return [
            *("--root-certificates", str(self.credentials / "ca.crt")),
            *("--auth-supernode-private-key", str(self.node_key(i))),
        ]

    def cli_security(self) -> str:
        return f'root-certificates = "{self.credentials / "ca.crt"}"'

    def start_node(self, i: int, config: dict[str, str]) -> subprocess.Popen:
        write_node_key(self.node_key(i))
        if i not in self.unregistered:
            done = self.flwr(
                *("supernode", "register", str(self.node_key(i).with_suffix(".pub"))),
                *("local", "--format", "json"),
                timeout=60,
            )
            assert done.returncode == 0 and json.loads(done.stdout)["success"], done.stdout
        return super().start_node(i, config)
