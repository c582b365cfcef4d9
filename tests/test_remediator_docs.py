"""docs/remediator.md names every configuration field and every guard."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from remediator.findings import Detection
from remediator.planner import GUARDS, Policy
from remediator.queries import Windows


def test_the_doc_covers_every_setting_and_guard():
    doc = (Path(__file__).parent.parent / "docs" / "remediator.md").read_text()
    for cls in (Policy, Detection, Windows):
        for f in fields(cls):
            assert f"  {f.name}:" in doc, f"{cls.__name__}.{f.name} missing from the doc"
    for guard in GUARDS:
        assert f"| `{guard}` |" in doc, guard


def test_the_documented_config_is_accepted_and_a_bad_one_refused(tmp_path, capsys):
    import pytest

    from remediator.cli import main, parser, settings

    doc = (Path(__file__).parent.parent / "docs" / "remediator.md").read_text()
    example = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    config = tmp_path / "config.yaml"
    config.write_text(example)
    policy, sizing, windows = settings(
        parser().parse_args(["plan", "--config", str(config), "--max-per-node", "3"])
    )
    assert policy == Policy(max_per_node=3)  # the documented values are the defaults
    assert sizing == Detection() and windows == Windows()
    config.write_text("policy:\n  max_per_nod: 3\n")
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--config", str(config)])
    assert exit_.value.code == 2
    assert "policy takes" in capsys.readouterr().err
