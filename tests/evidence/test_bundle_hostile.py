"""A bundle received from elsewhere is read defensively (preflight/evidence/bundle.py): links
that leave it are refused, metadata of the wrong JSON type is refused naming the file and the
field (never misread), and ``analyze`` turns each into exit 2 without a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from preflight.app.cli import main
from preflight.evidence.bundle import BundleError, read_bundle

FLEET = Path(__file__).resolve().parents[2] / "examples" / "h200-fleet"


@pytest.fixture
def bundle(tmp_path) -> Path:
    root = tmp_path / "bundle"
    shutil.copytree(FLEET, root)
    return root


def test_a_link_out_of_the_bundle_is_refused(bundle, tmp_path, capsys):
    secret = tmp_path / "id_ed25519"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n")
    log = bundle / "hosts" / "gpu001" / "kernel-log.txt"
    log.unlink()
    log.symlink_to(secret)
    with pytest.raises(BundleError, match="outside the bundle; refused"):
        read_bundle(bundle)
    assert main(["analyze", str(bundle), "--out", str(tmp_path / "out"), "-q"]) == 2
    assert "outside the bundle" in capsys.readouterr().err.replace("\n", "")
    assert not (tmp_path / "out").exists()


def test_a_linked_host_directory_out_of_the_bundle_is_refused(bundle, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.move(bundle / "hosts" / "gpu002", elsewhere)
    (bundle / "hosts" / "gpu002").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(BundleError, match="gpu002: a link to .* outside the bundle"):
        read_bundle(bundle)


def test_a_link_inside_the_bundle_is_read(bundle):
    d = bundle / "hosts" / "gpu001"
    (d / "ibstat.txt").unlink()
    (d / "ibstat.txt").symlink_to(bundle / "hosts" / "gpu002" / "ibstat.txt")
    assert read_bundle(bundle).probes_of("gpu001")["ibstat"].stdout


@pytest.mark.parametrize(("field", "value", "kind"), [
    ("timed_out", "false", "true or false"),
    ("exit_code", "0", "an integer or null"),
    ("exit_code", True, "an integer or null"),
    ("duration_s", "fast", "a finite number of seconds"),
    ("command", "nvidia-smi -q -x", "a list of strings"),
    ("stderr", 42, "a string"),
    ("error", ["refused"], "a string"),
])
def test_probe_metadata_of_the_wrong_type_is_refused_naming_file_and_field(bundle, tmp_path, capsys,
                                                                           field, value, kind):
    meta_path = bundle / "hosts" / "gpu003" / "nvidia-smi-q-x.json"
    meta = json.loads(meta_path.read_text())
    meta[field] = value
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(BundleError) as exc:
        read_bundle(bundle)
    assert str(exc.value) == f"{meta_path}: field {field!r} must be {kind}, not {value!r}"
    assert main(["analyze", str(bundle), "--out", str(tmp_path / "out"), "-q"]) == 2


def test_a_header_listing_a_host_twice_or_with_a_non_string_date(bundle):
    header = json.loads((bundle / "bundle.json").read_text())
    (bundle / "bundle.json").write_text(json.dumps({**header, "hosts": ["gpu001", "gpu001"]}))
    with pytest.raises(BundleError, match="lists gpu001 more than once"):
        read_bundle(bundle)
    (bundle / "bundle.json").write_text(json.dumps({**header, "created": 1700000000}))
    with pytest.raises(BundleError, match="field 'created' must be an ISO-8601 string"):
        read_bundle(bundle)


def test_a_probe_json_that_is_not_utf8_or_is_a_list(bundle):
    meta_path = bundle / "hosts" / "gpu003" / "ibstat.json"
    meta_path.write_bytes(b"\xff\xfe{")
    with pytest.raises(BundleError, match="invalid JSON"):
        read_bundle(bundle)
    meta_path.write_text("[]")
    with pytest.raises(BundleError, match="not a JSON object"):
        read_bundle(bundle)
