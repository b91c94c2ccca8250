"""Parsers for ``nvidia-smi nvlink --status`` and ``nvidia-smi nvlink -e``.

Probes ``nvidia-smi-nvlink-status`` (same text as ``nvlink -s``) and
``nvidia-smi-nvlink-errors``. Both print a header per GPU and indented per-link lines::

    GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)
    \\t Link 0: 26.562 GB/s            (--status; "<inactive>" for a link that is down)
             Link 0: Replay Errors: 0   (-e; one line per counter, blank lines between links)

or, in place of link lines, one line saying why there are none. Real variants handled:

- healthy: 18 links at 26.562 GB/s (H100/H200), 6 at 25.781 GB/s (V100-SXM2), 8 GPUs;
- "Nvlink queries are not supported for Devices in MIG mode" (H100 with MIG on),
  "Device does not have or support Nvlink" (L40S), and
  "NVML: Unable to retrieve NVLink information as all links are inActive" (reported on B200
  nodes with dead links): each gets its own ``reason``;
- ``-e`` counter names as printed by the driver (Replay/Recovery/CRC on Hopper, CRC Flit and
  CRC Data on older parts), blank lines between links, and pasted excerpts with elisions;
- a pasted excerpt whose elided part is a line of dots (``....`` before ``GPU 3:`` in
  Azure/azhpc-diagnostics#73): noted in ``notes`` as an elision, so a reader does not take
  the GPUs listed for all the GPUs of the node (``excerpt`` is then True);
- empty output (see below).

Empty output is a result, not a ParseError. A 1-GPU H200 VM printed nothing at all for
``nvlink --status`` (corpus h200-vm/nvlink-status.txt), and tools that script nvidia-smi
note the same for single-GPU and NVLink-less hosts (canonical/checkbox PR #431). A missing
tool leaves no ``.txt`` in the bundle, so an empty one means the tool ran and had nothing to
say: the parser returns no GPUs with a note, and the check decides whether the platform
should have had NVLink.

Other NVLink views are rejected with ParseError naming what they are, because their lines
look alike but mean something else: ``nvlink -gt``/``-gt d`` throughput counters
("Link 0: Data Tx: 648555824 KiB") and ``dcgmi nvlink --link-status`` (a U/D grid).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.parse import ParseError, finite, is_number

_GPU_HEADER = re.compile(r"GPU ([0-9]+):\s*(.*)")
_UUID = re.compile(r"\(UUID:\s*([^)]*)\)")
_LINK = re.compile(r"\s*Link ([0-9]+):\s*(.*?)\s*")
_LOOSE_LINK = re.compile(r"\s*Link (\S+):\s*(.*?)\s*")
_SPEED = re.compile(r"([0-9]+(?:\.[0-9]+)?) GB/s")
_COUNTER = re.compile(r"(.+?):\s*(\S+)")
_THROUGHPUT = re.compile(r"Data [TR]x:", re.IGNORECASE)
_DCGMI = re.compile(r"NvLink Link Status|^\s*gpuId [0-9]+:", re.MULTILINE)

_EMPTY_NOTE = "empty output: nvidia-smi listed no GPU (seen on a 1-GPU VM); NVLink state unknown"
_ELISION = re.compile(r"\.{3,}|\u2026")
ELIDED_NOTE = "lines elided (a pasted excerpt): the GPUs listed may not be all the node's GPUs"


@dataclass(frozen=True)
class NvlinkLink:
    """One link of ``nvlink --status``; speed None when ``<inactive>`` (or unreadable)."""

    number: int
    speed_gbps: float | None

    @property
    def active(self) -> bool:
        return self.speed_gbps is not None


@dataclass(frozen=True)
class NvlinkGpu:
    """One GPU's links, or why it has none.

    ``supported``: True when links were listed or NVML says they exist but are all inactive;
    False when the device has no NVLink; None when it cannot be told (MIG mode, an error).
    ``reason``: None, "mig-mode", "no-nvlink", "all-links-inactive" or "error";
    ``message``: the tool's own words for it.
    """

    index: int | None
    name: str | None
    uuid: str | None
    links: tuple[NvlinkLink, ...]
    supported: bool | None
    reason: str | None = None
    message: str | None = None

    @property
    def active_count(self) -> int:
        return sum(link.active for link in self.links)

    @property
    def inactive_count(self) -> int:
        return len(self.links) - self.active_count


@dataclass(frozen=True)
class NvlinkStatus:
    gpus: tuple[NvlinkGpu, ...]
    notes: tuple[str, ...] = ()

    @property
    def excerpt(self) -> bool:
        """True when the text had elided lines: its GPU list need not be complete."""
        return ELIDED_NOTE in self.notes


@dataclass(frozen=True)
class NvlinkLinkErrors:
    """One link's ``nvlink -e`` counters, keyed "replay", "recovery", "crc", "crc_flit", ..."""

    number: int
    counters: tuple[tuple[str, int], ...]

    def counter(self, name: str) -> int | None:
        return dict(self.counters).get(name)

    @property
    def total(self) -> int:
        return sum(value for _, value in self.counters)


@dataclass(frozen=True)
class NvlinkGpuErrors:
    """One GPU's error counters; ``supported``/``reason``/``message`` as in NvlinkGpu."""

    index: int | None
    name: str | None
    uuid: str | None
    links: tuple[NvlinkLinkErrors, ...]
    supported: bool | None
    reason: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class NvlinkErrors:
    gpus: tuple[NvlinkGpuErrors, ...]
    notes: tuple[str, ...] = ()

    def nonzero(self) -> tuple[tuple[int | None, int, str, int], ...]:
        """(gpu index, link, counter, value) for every counter above zero."""
        return tuple(
            (gpu.index, link.number, name, value)
            for gpu in self.gpus
            for link in gpu.links
            for name, value in link.counters
            if value
        )


@dataclass
class _Block:
    """The lines under one ``GPU n:`` header (internal, mutable while reading)."""

    index: int | None
    name: str | None
    uuid: str | None
    links: list[tuple[int, str]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)


def parse_nvlink_status(text: str) -> NvlinkStatus:
    """Parse ``nvidia-smi nvlink --status``; see the module docstring."""
    if not text.strip():
        return NvlinkStatus(gpus=(), notes=(_EMPTY_NOTE,))
    notes: list[str] = []
    blocks = _blocks(text, notes)
    values = [value for block in blocks for _, value in block.links]
    if values and not any(_SPEED.fullmatch(v) or v == "<inactive>" for v in values):
        raise ParseError("link lines carry no speeds: not `nvidia-smi nvlink --status` output")
    gpus = []
    for block in blocks:
        links = []
        for number, value in block.links:
            speed = _SPEED.fullmatch(value)
            gbps = finite(speed.group(1)) if speed else None
            if value != "<inactive>" and gbps is None:
                # A speed past float range (a run of digits) is no speed either.
                notes.append(f"GPU {block.index} link {number}: unreadable status {value[:80]!r}")
            links.append(NvlinkLink(number, gbps))
        gpus.append(NvlinkGpu(block.index, block.name, block.uuid, tuple(links),
                              *_support(block, notes)))
    return NvlinkStatus(gpus=tuple(gpus), notes=tuple(notes))


def parse_nvlink_errors(text: str) -> NvlinkErrors:
    """Parse ``nvidia-smi nvlink -e``; see the module docstring."""
    if not text.strip():
        return NvlinkErrors(gpus=(), notes=(_EMPTY_NOTE,))
    notes: list[str] = []
    blocks = _blocks(text, notes)
    values = [value for block in blocks for _, value in block.links]
    if values and not any(_COUNTER.fullmatch(v) for v in values):
        raise ParseError("link lines carry no counters: not `nvidia-smi nvlink -e` output")
    gpus = []
    for block in blocks:
        counters: dict[int, list[tuple[str, int]]] = {}
        for number, value in block.links:
            match = _COUNTER.fullmatch(value)
            if match and is_number(match.group(2)):
                counters.setdefault(number, []).append(
                    (_counter_key(match.group(1)), int(match.group(2)))
                )
            else:
                notes.append(f"GPU {block.index} link {number}: unreadable counter {value!r}")
        links = tuple(NvlinkLinkErrors(n, tuple(c)) for n, c in counters.items())
        gpus.append(NvlinkGpuErrors(block.index, block.name, block.uuid, links,
                                    *_support(block, notes)))
    return NvlinkErrors(gpus=tuple(gpus), notes=tuple(notes))


def _blocks(text: str, notes: list[str]) -> list[_Block]:
    """Group lines by GPU header; raise ParseError if the text is not nvidia-smi nvlink."""
    if _DCGMI.search(text):
        raise ParseError("this is `dcgmi nvlink --link-status` output, not nvidia-smi nvlink")
    if _THROUGHPUT.search(text):
        raise ParseError("this is `nvidia-smi nvlink -gt` throughput output, not status/errors")
    blocks: list[_Block] = []
    for line in text.splitlines():
        header = _GPU_HEADER.fullmatch(line.strip())
        link = _LINK.fullmatch(line)
        if _ELISION.fullmatch(line.strip()):
            if ELIDED_NOTE not in notes:
                notes.append(ELIDED_NOTE)
        elif header:
            blocks.append(_gpu_block(header))
        elif not link and _LOOSE_LINK.fullmatch(line):
            # "Link ٣:" or "Link ²:": a link line whose number is not an ASCII numeral.
            notes.append(f"GPU {blocks[-1].index if blocks else None}: unreadable counter {line.strip()[:80]!r}")
        elif link:
            if not blocks:
                notes.append("link lines before any GPU header: GPU unknown")
                blocks.append(_Block(None, None, None))
            blocks[-1].links.append((int(link.group(1)), link.group(2)))
        elif line.strip() and blocks:
            blocks[-1].messages.append(line.strip())
        elif line.strip():
            raise ParseError(f"not nvidia-smi nvlink output: {line.strip()[:120]!r}")
    return blocks


def _gpu_block(header: re.Match[str]) -> _Block:
    """Read ``GPU 0: NAME (UUID: GPU-...)``; text after the UUID is a message."""
    rest = header.group(2)
    uuid = _UUID.search(rest)
    block = _Block(int(header.group(1)), rest.strip() or None, None)
    if uuid:
        block.name = rest[: uuid.start()].strip() or None
        block.uuid = uuid.group(1).strip()
        trailing = rest[uuid.end():].strip()
        if trailing:
            block.messages.append(trailing)
    return block


def _support(block: _Block, notes: list[str]) -> tuple[bool | None, str | None, str | None]:
    """(supported, reason, message) from the block's links and non-link lines."""
    numbers = sorted({number for number, _ in block.links})
    gaps = [f"{a}->{b}" for a, b in zip(numbers, numbers[1:], strict=False) if b != a + 1]
    if gaps:
        notes.append(f"GPU {block.index}: link numbers jump {', '.join(gaps)} (lines elided?)")
    message = " ".join(block.messages) or None
    if block.links:
        if message:
            notes.append(f"GPU {block.index}: unrecognised lines {block.messages}")
        return True, None, None
    if message is None:
        notes.append(f"GPU {block.index}: no link lines and no message (output truncated?)")
        return None, None, None
    lowered = message.lower()
    if "mig mode" in lowered:
        return None, "mig-mode", message
    if "all links are inactive" in lowered:
        # NVML found NVLink on the device but no link trained: a fault on an NVLink platform.
        return True, "all-links-inactive", message
    if "does not have or support" in lowered or "not supported" in lowered:
        return False, "no-nvlink", message
    return None, "error", message


def _counter_key(label: str) -> str:
    """"CRC Flit Errors" -> "crc_flit"."""
    words = label.lower().split()
    if words and words[-1] in ("errors", "error"):
        words = words[:-1]
    return "_".join(words)
