"""Keys and certificates for a local federation: ``fedstats-certificates``.

    fedstats-certificates certs site_a site_b

writes into ``certs/``:

* ``ca.crt`` (and ``ca.key``): a certificate authority of this federation;
* ``server.pem`` and ``server.key``: the SuperLink's TLS certificate, signed by the CA, for
  ``localhost``, ``127.0.0.1`` and ``::1`` (``--host NAME`` adds names or addresses);
* ``<node>`` and ``<node>.pub`` for every node named: its authentication key pair (ECDSA
  P-384, OpenSSH format), which the SuperNode signs its requests with
  (``--auth-supernode-private-key certs/site_a``) and the SuperLink's operator registers
  (``flwr supernode register certs/site_a.pub ...``);
* with ``--flwr-home DIR``: ``DIR/config.toml``, the ``flwr`` command's connection ``local``
  to the SuperLink at ``--address`` (default ``127.0.0.1:8000``) over TLS with this CA (use
  it with ``FLWR_HOME=DIR``).

Private keys are written readable by their owner only. In a real federation each node makes
its own key pair (``fedstats-certificates mykeys site_a --keys-only``) and sends only the
``.pub`` file; the CA's key stays with the SuperLink's operator. Uses the ``cryptography`` package (installed with Flower).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
from collections.abc import Sequence
from pathlib import Path

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def _write(path: Path, data: bytes, private: bool = False) -> None:
    if private:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(path, 0o600)
    else:
        path.write_bytes(data)


def node_keys(folder: str | os.PathLike, name: str) -> tuple[Path, Path]:
    """Write a SuperNode's authentication key pair ``folder/name`` (private, OpenSSH) and
    ``folder/name.pub``; their paths."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if not _NAME.match(name):
        raise ValueError(f"a node's name is letters, digits, '_', '.' and '-', got {name!r}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    _write(out / name, private, private=True)
    _write(out / f"{name}.pub", public + f" {name}\n".encode())
    return out / name, out / f"{name}.pub"


def federation_keys(
    folder: str | os.PathLike, nodes: Sequence[str] = (), hosts: Sequence[str] = (), days: int = 365
) -> dict[str, Path]:
    """Write the CA, the SuperLink's certificate and every node's key pair into ``folder``
    (see the module docs); the paths by role (``ca``, ``server-cert``, ``server-key`` and each
    node's name)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=int(days)))

    def pem(key) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedstats federation CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    for h in ("127.0.0.1", "::1", *hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    server_key = ec.generate_private_key(ec.SECP384R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedstats SuperLink")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(out / "ca.key", pem(ca_key), private=True)
    _write(out / "ca.crt", ca.public_bytes(serialization.Encoding.PEM))
    _write(out / "server.key", pem(server_key), private=True)
    _write(out / "server.pem", server.public_bytes(serialization.Encoding.PEM))
    paths = {"ca": out / "ca.crt", "server-cert": out / "server.pem", "server-key": out / "server.key"}
    for n in nodes:
        paths[n] = node_keys(out, n)[0]
    return paths


def flwr_config(home: str | os.PathLike, ca: str | os.PathLike, address: str = "127.0.0.1:8000") -> Path:
    """Write ``home/config.toml``: the ``flwr`` command's connection ``local`` to the SuperLink
    at ``address``, over TLS with the CA certificate ``ca`` (an absolute path, as ``flwr``
    requires)."""
    out = Path(home)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.toml"
    path.write_text(
        '[superlink]\ndefault = "local"\n\n[superlink.local]\n'
        f'address = "{address}"\nroot-certificates = "{Path(ca).resolve().as_posix()}"\n',
        encoding="utf-8",
    )
    return path


def main(argv: Sequence[str] | None = None) -> None:
    """The ``fedstats-certificates`` command (see the module docs)."""
    parser = argparse.ArgumentParser(
        prog="fedstats-certificates",
        description="Write a CA, the SuperLink's TLS certificate and each SuperNode's key pair for a local federation.",
    )
    parser.add_argument("folder", help="where to write them")
    parser.add_argument("nodes", nargs="*", help="the SuperNodes' names: one key pair each")
    parser.add_argument("--host", action="append", default=[], help="another name or address of the SuperLink")
    parser.add_argument("--days", type=int, default=365, help="validity of the certificates (default 365)")
    parser.add_argument("--flwr-home", help="also write the flwr command's connection to the SuperLink here")
    parser.add_argument("--address", default="127.0.0.1:8000", help="the SuperLink's address (default 127.0.0.1:8000)")
    parser.add_argument("--keys-only", action="store_true", help="write only the nodes' key pairs (a site's own)")
    args = parser.parse_args(argv)
    if args.keys_only:
        for n in args.nodes:
            print(f"{n}: {node_keys(args.folder, n)[0]}")
        return
    paths = federation_keys(args.folder, args.nodes, args.host, args.days)
    if args.flwr_home:
        paths["flwr-config"] = flwr_config(args.flwr_home, paths["ca"], args.address)
    for role, path in paths.items():
        print(f"{role}: {path}")


if __name__ == "__main__":
    main()
