"""The node's own defences, without a running federation (the deployment tests run them on
127.0.0.1): the list of approved apps and its check, ``fedstats-supernode``'s refusals, the
keys and certificates of ``fedstats-certificates``, and a run's expected clients."""

from __future__ import annotations

import hashlib
import io
import stat
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from fedstats.federation.flower.approved import AppNotApproved, app_hash, approved_hashes, check_app, supernode_main  # noqa: E402
from fedstats.federation.flower.certificates import federation_keys, main  # noqa: E402
from fedstats.federation.flower.session import _expected  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "examples" / "flower_app"


def test_an_app_is_approved_by_the_hash_of_what_the_node_receives(tmp_path):
    from flwr.cli.build import build_fab_from_disk

    fab = build_fab_from_disk(APP)  # what `flwr run examples/flower_app` sends
    h = hashlib.sha256(fab).hexdigest()
    assert app_hash(APP) == h == app_hash(APP)  # builds are deterministic
    (tmp_path / "app.fab").write_bytes(fab)
    assert app_hash(tmp_path / "app.fab") == h and app_hash(h.upper()) == h
    listing = tmp_path / "approved.txt"
    listing.write_text(f"# approved by the node's owner\n{h} fedstats example app\n")
    assert approved_hashes(listing) == {h}
    assert check_app(fab, listing) == h
    # one byte changed in one file of the app: another hash, refused
    z = zipfile.ZipFile(io.BytesIO(fab))
    tampered = io.BytesIO()
    with zipfile.ZipFile(tampered, "w") as out:
        for name in z.namelist():
            data = z.read(name)
            out.writestr(name, data + b"\n" if name.endswith("client_app.py") else data)
    with pytest.raises(AppNotApproved, match="not on this node's list of approved apps"):
        check_app(tampered.getvalue(), listing)
    with pytest.raises(AppNotApproved, match="no list of approved apps"):
        check_app(fab, "")
    listing.write_text("not-a-hash\n")
    with pytest.raises(ValueError, match="line 1: 'not-a-hash' is not a SHA-256 hash"):
        approved_hashes(listing)
    with pytest.raises(FileNotFoundError, match="neither an app directory"):
        app_hash(tmp_path / "missing")


def test_fedstats_supernode_refuses_an_empty_list_and_an_unlabelled_insecure_node(tmp_path, capsys):
    listing = tmp_path / "approved.txt"
    with pytest.raises(SystemExit):
        supernode_main(["--approved-apps", str(listing), "--", "--superlink", "127.0.0.1:1"])
    assert "approves no app" in capsys.readouterr().err
    supernode_main(["--approved-apps", str(listing), "--approve", str(APP), "--print-only"])
    assert approved_hashes(listing) == {app_hash(APP)}
    supernode_main(["--approved-apps", str(listing), "--approve", str(APP), "--print-only"])  # listed once
    assert len(listing.read_text().splitlines()) == 1
    with pytest.raises(SystemExit):
        supernode_main(["--approved-apps", str(listing), "--", "--insecure", "--superlink", "127.0.0.1:1"])
    assert "labelled rehearsal only: add --rehearsal" in capsys.readouterr().err


def test_certificates_and_node_keys(tmp_path, capsys):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    main([str(tmp_path), "site_a", "site_b", "--host", "link.example.org", "--flwr-home", str(tmp_path / "home")])
    assert "site_a: " in capsys.readouterr().out
    config = (tmp_path / "home" / "config.toml").read_text()
    assert (
        'address = "127.0.0.1:8000"' in config and f'root-certificates = "{(tmp_path / "ca.crt").as_posix()}"' in config
    )
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "link.example.org" in names.get_values_for_type(x509.DNSName)
    assert {str(a) for a in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    for name in ("ca.key", "server.key", "site_a", "site_b"):  # private keys: the owner's only
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    key = serialization.load_ssh_private_key((tmp_path / "site_a").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert (tmp_path / "site_a.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    main([str(tmp_path / "own"), "site_c", "--keys-only"])
    assert sorted(p.name for p in (tmp_path / "own").iterdir()) == ["site_c", "site_c.pub"]
    with pytest.raises(ValueError, match="a node's name"):
        federation_keys(tmp_path, ["../evil"])


def test_expected_clients_in_every_form():
    assert _expected(None) is None and _expected("") is None and _expected(" , ") is None
    assert _expected("site_a=12, site_b") == {"site_a": 12, "site_b": None}
    assert _expected(["site_a", "site_b=7"]) == {"site_a": None, "site_b": 7}
    assert _expected({"site_a": 3}) == {"site_a": 3}
    with pytest.raises(ValueError, match="expected twice"):
        _expected("a,a=3")
    with pytest.raises(ValueError, match="is not an integer"):
        _expected("a=x")
