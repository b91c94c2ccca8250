"""Section tree of the indentation-structured text that ``nvidia-smi -q`` prints.

The input is lines of ``Label   : value`` or a bare ``Label`` opening a section, nested by
indentation (four spaces a level in real output)::

    GPU 00000000:00:06.0
        MIG Mode
            Current                                        : Disabled
        Clocks Event Reasons
            HW Slowdown                                    : Not Active
                HW Thermal Slowdown                        : Not Active

This module knows nothing about what the labels mean; ``nvidia_smi`` maps the tree to records.
Real variants it copes with: label padding of any width (2018 drivers pad much narrower),
tabs (expanded to four columns, one level), trailing spaces after labels, the
``=====NVSMI LOG=====`` banner, blank lines, author elisions such as ``[...]``, excerpts
that start deeper than column 0 or are de-indented, and values that themselves contain colons
(``Bus Id : 00000000:00:06.0``, timestamps). A value line may own children: the Processes
section nests ``Type``/``Name`` under ``Process ID : 11327``. Labels repeat (one
``Process ID`` per process), so children are an ordered tuple, not a mapping.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

# The separator is the first colon followed by whitespace or the end of the line, so a
# bare "GPU 00000000:00:06.0" header (colons followed by digits) stays a section label.
_KEY_VALUE = re.compile(r"^(?P<key>.*?)\s*:(?:\s+(?P<value>.*))?$")
_BANNER = re.compile(r"^=+[^=]*=+$")


def normalise_label(label: str) -> str:
    """Case- and spacing-insensitive form of a label, used for every lookup."""
    return " ".join(label.split()).casefold()


@dataclass(frozen=True)
class TextNode:
    """One line of the output: its label, its value (None for a section header) and the
    lines indented under it."""

    key: str
    value: str | None
    line: int
    children: tuple[TextNode, ...] = ()

    def child(self, label: str) -> TextNode | None:
        """The first direct child with this label."""
        wanted = normalise_label(label)
        return next((c for c in self.children if normalise_label(c.key) == wanted), None)

    def find(self, path: str) -> TextNode | None:
        """The node at a ``/``-separated label path below this one."""
        node: TextNode | None = self
        for label in path.split("/"):
            node = node.child(label) if node else None
        return node

    def value_at(self, path: str) -> str | None:
        node = self.find(path)
        return node.value if node else None

    def walk(self) -> Iterator[TextNode]:
        """Every node below this one, depth first, in output order."""
        for c in self.children:
            yield c
            yield from c.walk()


@dataclass
class _Draft:
    key: str
    value: str | None
    line: int
    indent: int
    children: list[_Draft] = field(default_factory=list)

    def freeze(self) -> TextNode:
        return TextNode(self.key, self.value, self.line, tuple(c.freeze() for c in self.children))


def read_sections(text: str) -> TextNode:
    """Parse the text into a tree under a root node with an empty label.

    Indentation decides parenthood relative to the lines above, never by absolute column,
    so an excerpt whose first line sits at column 8 still nests what follows it correctly.
    """
    root = _Draft("", None, 0, -1)
    stack = [root]
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.expandtabs(4).rstrip()
        content = line.strip()
        if not content or _BANNER.match(content):
            continue
        indent = len(line) - len(line.lstrip())
        match = _KEY_VALUE.match(content)
        if match:
            node = _Draft(match["key"], (match["value"] or "").strip(), number, indent)
        else:
            node = _Draft(content, None, number, indent)
        while stack[-1].indent >= indent:
            stack.pop()
        stack[-1].children.append(node)
        stack.append(node)
    return root.freeze()
