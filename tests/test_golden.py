"""The reference node's whole default exposition, compared line for line with the file
`make golden` wrote (tests/golden/): a metric, label, help string or value that changes
shows in review as a change to that file, as node_exporter's e2e output does."""

from __future__ import annotations

import difflib

from tests.golden.reference import GOLDEN, reference_exposition


def test_the_reference_node_s_exposition_is_the_golden_one():
    got, want = reference_exposition(), GOLDEN.read_text()
    diff = difflib.unified_diff(
        want.splitlines(), got.splitlines(), "golden", "now", n=0, lineterm=""
    )
    changed = list(diff)
    assert not changed, (
        f"{len(changed)} diff lines (if meant, `make golden` and review the file):\n"
        + "\n".join(changed[:40])
    )
