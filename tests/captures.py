"""Real captures read by the tests of more than one stage, named once (provenance in
tests/fixtures/corpus/MANIFEST.tsv)."""

from __future__ import annotations

from pathlib import Path

CORPUS = Path(__file__).parent / "fixtures" / "corpus"

# A Dell XE9780 (HGX B300) showing 7 of its 8 GPUs, driver 610: `nvidia-smi nvlink --status`
# and `topo -m`; and an lspci of two B300s listed by PCI device id only.
B300_NVLINK = (CORPUS / "nvlink" / "b300-sxm6-ac-xe9780-7-of-8-gpus-drv610-nvlink-s.txt").read_text()
B300_TOPO = (CORPUS / "topo" / "b300-xe9780-7-of-8-gpus-nv18-drv610-spaces.txt").read_text()
B300_LSPCI = (CORPUS / "lspci" / "b300-2gpu-lspci-grep-nvidia-device-3182.txt").read_text()
# A healthy 8 x H100 80GB HBM3 node (AWS p5, driver 550).
H100_P5_NVLINK = (CORPUS / "nvlink" / "h100-80gb-hbm3-8gpu-p5-drv550-nvlink-s.txt").read_text()
