"""persistence-mode on the lent H200's own nvidia-smi -q -x (tests/fixtures/h200-device, MANIFEST.tsv):
one GPU is "1 GPU", as the device run of 2026-12-03 showed it was not."""

from pathlib import Path

from ctx import make_host, run_check

DEVICE = Path(__file__).parents[1] / "fixtures" / "h200-device" / "bundle" / "hosts" / "vm"


def test_one_gpu_is_counted_in_the_singular():
    host = make_host({"nvidia-smi-q-x": (DEVICE / "nvidia-smi-q-x.txt").read_text()})
    [finding] = run_check("persistence-mode", host)
    assert finding.status.value == "pass" and finding.summary == "persistence mode on, 1 GPU"
