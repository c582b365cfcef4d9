"""docs/remediator.md names every configuration field and every guard."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from numaguard.remediator.core.findings import Detection
from numaguard.remediator.core.guards import GUARDS
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import Windows
from numaguard.remediator.signals import Source


def test_the_doc_covers_every_setting_and_guard():
    doc = (Path(__file__).parent.parent / "docs" / "remediator.md").read_text()
    for cls in (Policy, Detection, Windows, Source):
        for f in fields(cls):
            assert f"  {f.name}:" in doc, f"{cls.__name__}.{f.name} missing from the doc"
    for guard in GUARDS:
        assert f"| `{guard}` |" in doc, guard


def test_the_documented_config_is_accepted_and_a_bad_one_refused(tmp_path, capsys):
    from numaguard.remediator.arguments import parser
    from numaguard.remediator.cli import main
    from numaguard.remediator.config import settings

    doc = (Path(__file__).parent.parent / "docs" / "remediator.md").read_text()
    example = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    config = tmp_path / "config.yaml"
    config.write_text(example)
    policy, sizing, windows, source = settings(
        parser().parse_args(["plan", "--config", str(config), "--max-per-node", "3"])
    )
    assert policy == Policy(max_per_node=3)  # the documented values are the defaults
    assert sizing == Detection() and windows == Windows() and source == Source()
    config.write_text("policy:\n  max_per_nod: 3\n")
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--config", str(config)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "policy.max_per_nod: no such setting (did you mean max_per_node?)" in err


BAD = [
    # (config text, extra flags, what the error must say)
    ("policy:\n  protected_namespaces: team-gpu-c\n", [], "policy.protected_namespaces"),
    (
        'policy:\n  max_per_cycle: "three"\n',
        [],
        "policy.max_per_cycle: Input should be a valid integer",
    ),
    ("policy:\n  max_per_cycle: -1\n", [], "greater than or equal to 0 (got -1)"),
    ("policy:\n  cooldown_seconds: 1h\n", [], "policy.cooldown_seconds"),
    ('policy:\n  dry_run: "no"\n', [], "policy.dry_run: Input should be a valid boolean"),
    (
        "detection:\n  low_utilization: 30\n",
        [],
        "detection.low_utilization: Input should be less than or equal to 1",
    ),
    (
        "detection:\n  low_utilization: 0.95\n",
        [],
        "detection: low_utilization (0.95) must be under saturated (0.9)",
    ),
    (
        "policy:\n  verify_after_seconds: 600\n  verify_deadline_seconds: 300\n",
        [],
        "policy: verify_deadline_seconds (300) must be at least verify_after_seconds (600)",
    ),
    ("windows:\n  sizing: an hour\n", [], "windows.sizing: String should match pattern"),
    ("policy:\n  stale_after_seconds: .inf\n", [], "finite number"),
    ('prometheus:\n  selector: "} or vector(1)"\n', [], "prometheus.selector"),
    ("policy: [1]\n", [], "policy must be a mapping"),
    ("", ["--max-per-node", "-3"], "policy.max_per_node"),
    ("", ["--finding-window", "10 minutes"], "windows.finding"),
    (
        "policy:\n  enforcement:\n    cross_numa: evict\n",
        [],
        "policy.enforcement.cross_numa: Input should be 'act', 'recommend' or 'ignore'",
    ),
    (
        "policy:\n  enforcement:\n    topology: act\n",
        [],
        "policy.enforcement.topology: no such setting (the keys are cross_numa, starved, "
        "gpu_link, gpu_fragmentation, noisy_neighbour, mis_sized, core_isolation, "
        "topology_affinity_error)",
    ),
    ("policy:\n  enforcement: act\n", [], "policy.enforcement"),
    ("", ["--enforce", "mis_sized"], "give KIND=MODE"),
    ("", ["--enforce", "starved=off"], "MODE one of act, recommend, ignore"),
    (
        "policy:\n  min_fix_gain:\n    cross_numa: -0.5\n",
        [],
        "policy.min_fix_gain.cross_numa: Input should be greater than or equal to 0",
    ),
    ("policy:\n  min_fix_gain:\n    mis_sized: 1\n", [], "policy.min_fix_gain.mis_sized"),
    ("", ["--min-fix-gain", "starved=fast"], "GAIN a number >= 0"),
    ("", ["--min-fix-gain", "starved=nan"], "GAIN a number >= 0"),
    ("", ["--min-fix-gain", "crossnuma=1.2"], "KIND one of cross_numa, starved"),
]


@pytest.mark.parametrize(("text", "flags", "says"), BAD)
def test_a_wrong_value_is_refused_naming_the_key(tmp_path, capsys, text, flags, says):
    from numaguard.remediator.cli import main

    config = tmp_path / "config.yaml"
    config.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--config", str(config), *flags])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_lease_timing_must_be_ordered(capsys):
    from numaguard.remediator.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["run", "--lease-duration", "10", "--renew-deadline", "15"])
    assert exit_.value.code == 2
    assert "--retry-period < --renew-deadline < --lease-duration" in capsys.readouterr().err


def test_enforcement_flags_override_the_config_kind_by_kind(tmp_path):
    from numaguard.remediator.arguments import parser
    from numaguard.remediator.config import settings
    from numaguard.remediator.core.policy import Enforcement

    config = tmp_path / "config.yaml"
    config.write_text("policy:\n  enforcement:\n    cross_numa: ignore\n    starved: recommend\n")
    args = ["plan", "--config", str(config), "--enforce", "mis_sized=recommend"]
    policy = settings(parser().parse_args([*args, "--enforce", "cross_numa=act"]))[0]
    assert policy.enforcement == Enforcement(
        cross_numa="act", starved="recommend", mis_sized="recommend"
    )


def test_minimum_gains_come_from_the_config_and_flags_kind_by_kind(tmp_path):
    from numaguard.remediator.arguments import parser
    from numaguard.remediator.config import settings
    from numaguard.remediator.core.policy import FixGain

    config = tmp_path / "config.yaml"
    config.write_text("policy:\n  min_fix_gain:\n    cross_numa: 1.5\n    oversized: 0\n")
    args = ["plan", "--config", str(config), "--min-fix-gain", "starved=2"]
    policy = settings(parser().parse_args([*args, "--min-fix-gain", "cross_numa=1.25"]))[0]
    assert policy.min_fix_gain == FixGain(cross_numa=1.25, starved=2.0, oversized=0.0)


def test_its_own_namespace_is_always_protected(monkeypatch):
    """Installed into a shared namespace (helm install -n monitoring), the remediator
    never acts on its neighbours there, whatever the config lists."""
    from numaguard.remediator.arguments import parser
    from numaguard.remediator.config import settings

    monkeypatch.setenv("POD_NAMESPACE", "monitoring")
    args = ["plan", "--protected-namespace", "team-a"]
    policy = settings(parser().parse_args(args))[0]
    assert policy.protected_namespaces == ("kube-system", "team-a", "monitoring")
    monkeypatch.delenv("POD_NAMESPACE")
    assert settings(parser().parse_args(["plan"]))[0].protected_namespaces == ("kube-system",)
