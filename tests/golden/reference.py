"""The reference node's whole exposition (docs/design.md: 8 NUMA nodes, 8 GPUs of 7 MIG
slices, its kubelet and resctrl), as its exporter serves it by default after two
cycles 15 s apart (bench/series.py builds it), with what differs run to run masked: what
the test compares with the file beside this one, so that every change to a metric shows
in review.

Regenerate with ``make golden`` (``python -m tests.golden.reference``)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from bench.series import expositions

GOLDEN = Path(__file__).with_name("reference-node.prom")
# the samples whose values are the run's, not the node's: how long things took, when
MASKED = re.compile(
    r"^(numaguard_\w*_(duration_seconds|timestamp_seconds)|process_\w+|python_gc_\w+)(\{.*\})? "
)


def masked(text: str) -> str:
    """The exposition with the run's own values (durations, times, the process's) masked."""
    return "".join(
        (m[0] + "<masked>\n" if (m := MASKED.match(line)) else line + "\n")
        for line in text.splitlines()
    )


def reference_exposition() -> str:
    return masked(expositions((False,))[False])


if __name__ == "__main__":
    GOLDEN.write_text(reference_exposition())
    print(f"wrote {GOLDEN}", file=sys.stderr)
