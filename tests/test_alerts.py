"""The rules in alerts/: generated files current, `promtool check rules` clean, every
expression parses and names only catalogue metrics or our recording rules, every alert
has its runbook, and `promtool test rules` for every alert: firing, quiet, and the
boundary of its window or `for:` — on Prometheus 2 and 3 (whose ranges are left-open)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from alerts import rules
from numaguard.contract.catalogue import series_names
from numaguard.remediator.core.queries import EXPORTER_JOB
from numaguard.simulator.parts.prometheus import VERSIONS, binary
from tests.helpers.promql import metric_names

pytestmark = pytest.mark.prometheus

N = {"node": "n1"}
POD = {**N, "namespace": "ml", "pod": "trainer", "pod_uid": "u1"}
SLICE = {**N, "gpu": "1", "gpu_uuid": "GPU-1", "mig_uuid": "MIG-1", "mig_profile": "3g.40gb"}

# alert -> (input series {series text: values}, [(eval time, expected label sets)]); the
# exporters' series get job="numaguard" (below) unless they name another job
CASES: dict[str, tuple[dict[str, str], list[tuple[str, list[dict]]]]] = {
    "NumaguardPodCrossNUMA": (
        {
            'numaguard_pod_cross_numa{node="n1",namespace="ml",pod="trainer",pod_uid="u1",'
            'reason="device_remote"}': "1x30",
            # flapped at 2m: sustained only once ten clean minutes have passed
            'numaguard_pod_cross_numa{node="n1",namespace="ml",pod="web",pod_uid="u2",'
            'reason="memory_remote"}': "1 1 0 1x27",
            'numaguard_pod_cross_numa{node="n1",namespace="ml",pod="ok",pod_uid="u3",'
            'reason="cpu_span"}': "0x30",
            # another scrape target serving the same series: never read
            'numaguard_pod_cross_numa{job="tenant",node="n1",namespace="ml",pod="ok",pod_uid="u3",'
            'reason="cpu_span"}': "1x30",
        },
        [
            ("9m", []),
            ("10m", [{**POD, "reason": "device_remote"}]),
            # the flap at 2m is the window's first sample: on 3 only the offset sees it
            ("12m", [{**POD, "reason": "device_remote"}]),
            (
                "13m",
                [
                    {**POD, "reason": "device_remote"},
                    {
                        **N,
                        "namespace": "ml",
                        "pod": "web",
                        "pod_uid": "u2",
                        "reason": "memory_remote",
                    },
                ],
            ),
        ],
    ),
    "NumaguardGPUStarved": (
        {
            'numaguard_gpu_starved{node="n1",gpu="4",gpu_uuid="GPU-4",mig_uuid="",namespace="ml",'
            'pod="trainer",pod_uid="u1",reason="cpu_pressure"}': "1x20",
            'numaguard_gpu_starved{node="n1",gpu="4",gpu_uuid="GPU-4",mig_uuid="",namespace="ml",'
            'pod="trainer",pod_uid="u1",reason="cpu_throttled"}': "0x20",
        },
        [
            ("9m", []),
            ("10m", [{**POD, "gpu": "4", "gpu_uuid": "GPU-4", "reason": "cpu_pressure"}]),
        ],
    ),
    "NumaguardMIGSliceOversized": (
        {
            'numaguard_mig_utilization_ratio{node="n1",gpu="1",gpu_uuid="GPU-1",mig_uuid="MIG-1",'
            'mig_profile="3g.40gb",kind="sm"}': "0.05x90",
            'numaguard_mig_processes{node="n1",gpu="1",gpu_uuid="GPU-1",mig_uuid="MIG-1",'
            'mig_profile="3g.40gb"}': "1x90",
            # idle and empty: nobody to tell
            'numaguard_mig_utilization_ratio{node="n1",gpu="1",gpu_uuid="GPU-1",mig_uuid="MIG-2",'
            'mig_profile="1g.10gb",kind="sm"}': "0x90",
            'numaguard_mig_processes{node="n1",gpu="1",gpu_uuid="GPU-1",mig_uuid="MIG-2",'
            'mig_profile="1g.10gb"}': "0x90",
            # just under the remediator's threshold (0.3), for the whole hour: oversized
            'numaguard_mig_utilization_ratio{node="n1",gpu="1",gpu_uuid="GPU-1",mig_uuid="MIG-3",'
            'mig_profile="2g.20gb",kind="sm"}': "0.29x90",
            'numaguard_mig_processes{node="n1",gpu="1",gpu_uuid="GPU-1",mig_uuid="MIG-3",'
            'mig_profile="2g.20gb"}': "1x90",
        },
        # not before a whole sizing window of data, then both
        [
            ("59m", []),
            (
                "61m",
                [
                    {**SLICE, "kind": "sm"},
                    {**SLICE, "mig_uuid": "MIG-3", "mig_profile": "2g.20gb", "kind": "sm"},
                ],
            ),
        ],
    ),
    "NumaguardMIGSliceUndersized": (
        {
            'numaguard_mig_utilization_ratio{node="n1",gpu="1",gpu_uuid="GPU-1",mig_uuid="MIG-1",'
            'mig_profile="3g.40gb",kind="sm"}': "0.95x90",
            'numaguard_mig_utilization_ratio{node="n1",gpu="1",gpu_uuid="GPU-1",mig_uuid="MIG-2",'
            'mig_profile="1g.10gb",kind="sm"}': "0.5x90",
        },
        [("59m", []), ("61m", [{**SLICE, "kind": "sm"}])],
    ),
    "NumaguardHighRemoteMemoryTraffic": (
        {
            'numaguard_numa_node_remote_traffic_ratio{node="n1",numa_node="0"}': "0.7x30",
            'numaguard_numa_node_remote_traffic_ratio{node="n2",numa_node="0"}': "0.2x30",
        },
        [("14m", []), ("16m", [N])],
    ),
    "NumaguardLLCNoisyNeighbour": (
        {
            'numaguard_pod_llc_share_ratio{node="n1",l3_domain="0",namespace="batch",pod="noisy",'
            'pod_uid="u9"}': "0.6x20",
            'numaguard_pod_llc_share_ratio{node="n1",l3_domain="0",namespace="batch",pod="calm",'
            'pod_uid="u8"}': "0.3x20",
            'numaguard_gpu_starved{node="n1",gpu="4",gpu_uuid="GPU-4",mig_uuid="",namespace="ml",'
            'pod="trainer",pod_uid="u1",reason="cpu_pressure"}': "1x20",
        },
        [
            ("9m", []),
            ("11m", [{**N, "l3_domain": "0", "namespace": "batch", "pod": "noisy"}]),
        ],
    ),
    "NumaguardRMIDsExhausted": (
        {'numaguard_resctrl_unmonitored_pods{node="n1"}': "2x30"},
        [("14m", []), ("16m", [N])],
    ),
    "NumaguardExporterDown": (
        {
            'up{job="numaguard",instance="n1:9847"}': "0x15",
            'up{job="numaguard",instance="n2:9847"}': "1x15",
        },
        [("9m", []), ("11m", [{"job": "numaguard", "instance": "n1:9847"}])],
    ),
    "NumaguardCollectorFailing": (
        {
            'numaguard_collector_success{node="n1",collector="gpu"}': "0x20",
            'numaguard_collector_success{node="n1",collector="host_numa"}': "1x20",
        },
        [("9m", []), ("11m", [{**N, "collector": "gpu"}])],
    ),
    "NumaguardExporterStale": (
        # last success at t=0, never again; it is stale from 5m on, alerting 5m later
        {'numaguard_collector_last_success_timestamp_seconds{node="n1",collector="gpu"}': "0x20"},
        [("9m", []), ("12m", [{**N, "collector": "gpu"}])],
    ),
    "NumaguardRemediatorNoLeader": (
        {
            'numaguard_remediator_leader{job="numaguard-remediator",instance="a",pod="a"}': "0x20",
            'numaguard_remediator_leader{job="numaguard-remediator",instance="b",pod="b"}': "0x20",
            # another install, in another cluster, whose replica leads
            'numaguard_remediator_leader{job="numaguard-remediator",cluster="c2",instance="c"}': (
                "1x20"
            ),
        },
        [("9m", []), ("11m", [{"job": "numaguard-remediator"}])],
    ),
    "NumaguardRemediationActionsFailing": (
        {
            'numaguard_remediator_actions_total{kind="evict",result="failed"}': "0+1x40",
            'numaguard_remediator_actions_total{kind="evict",result="evicted"}': "0+1x40",
        },
        [("1m", []), ("10m", [{"kind": "evict", "result": "failed"}])],
    ),
    "NumaguardRemediationNotHolding": (
        {
            'numaguard_remediator_verifications_total{outcome="did_not_hold"}': "0 0 0 0 0 1x30",
            'numaguard_remediator_verifications_total{outcome="no_gain"}': "0x8 1x30",
            'numaguard_remediator_verifications_total{outcome="held"}': "0+1x35",
        },
        [
            ("3m", []),
            ("7m", [{"outcome": "did_not_hold"}]),
            # no_gain rose at 9m: an expected outcome, no alert
            ("10m", [{"outcome": "did_not_hold"}]),
        ],
    ),
    "NumaguardAdmissionRejections": (
        {
            'numaguard_remediator_rejected_pods{namespace="ml",workload="Deployment/ml/trainer",'
            'node="n1",reason="TopologyAffinityError"}': "2 3 5x20",
            'numaguard_remediator_rejected_pods{namespace="ml",workload="Deployment/ml/infer",'
            'node="n1",reason="TopologyAffinityError"}': "4x20",
        },
        [
            ("11m", []),
            (
                "13m",
                [
                    {
                        "namespace": "ml",
                        "workload": "Deployment/ml/trainer",
                        "node": "n1",
                        "reason": "TopologyAffinityError",
                    }
                ],
            ),
        ],
    ),
    "NumaguardDRAClaimsAndGPUInstancesDisagree": (
        {
            # a slice claimed and not made, for good
            'numaguard_dra_counter_mismatch_slices{node="n1",driver="gpu.nvidia.com",'
            'counter_set="gpu-0-counter-set",gpu_uuid="GPU-0",kind="claimed_without_instance"}': (
                "2x40"
            ),
            # a claim being prepared: brief, never an alert
            'numaguard_dra_counter_mismatch_slices{node="n1",driver="gpu.nvidia.com",'
            'counter_set="gpu-1-counter-set",gpu_uuid="GPU-1",kind="claimed_without_instance"}': (
                "1x3 0x37"
            ),
        },
        [
            ("14m", []),
            (
                "16m",
                [
                    {
                        "node": "n1",
                        "driver": "gpu.nvidia.com",
                        "counter_set": "gpu-0-counter-set",
                        "gpu_uuid": "GPU-0",
                        "kind": "claimed_without_instance",
                    }
                ],
            ),
        ],
    ),
    "NumaguardMIGRelayoutStuck": (
        {
            'numaguard_remediator_mig_relayout_nodes{phase="wedged"}': "0x3 1x20",
            'numaguard_remediator_mig_relayout_nodes{phase="failed"}': "0x20",
            # in flight: never an alert
            'numaguard_remediator_mig_relayout_nodes{phase="relabelled"}': "1x20",
        },
        [("7m", []), ("9m", [{"phase": "wedged"}])],
    ),
    "NumaguardMultiGPUPodWithoutP2P": (
        {
            # far: two GPUs across sockets, 0.8 GB/s each way through them
            'numaguard_pod_gpu_link_poor{node="n1",namespace="ml",pod="far",pod_uid="u1",'
            'reason="no_p2p"}': "1x40",
            'numaguard_pod_gpu_link_poor{node="n1",namespace="ml",pod="far",pod_uid="u1",'
            'reason="split_containers"}': "0x40",
            'numaguard_gpu_holder_info{node="n1",gpu="2",gpu_uuid="G2",mig_uuid="",'
            'pod_uid="u1",container="main"}': "1x40",
            'numaguard_gpu_holder_info{node="n1",gpu="4",gpu_uuid="G4",mig_uuid="",'
            'pod_uid="u1",container="main"}': "1x40",
            'numaguard_gpu_pcie_bytes_per_second{node="n1",gpu="2",gpu_uuid="G2",'
            'direction="tx"}': "8e8x40",
            'numaguard_gpu_pcie_bytes_per_second{node="n1",gpu="4",gpu_uuid="G4",'
            'direction="rx"}': "8e8x40",
            # idle: as badly placed, but moving nothing worth an alert
            'numaguard_pod_gpu_link_poor{node="n1",namespace="ml",pod="idle",pod_uid="u2",'
            'reason="no_p2p"}': "1x40",
            'numaguard_gpu_holder_info{node="n1",gpu="5",gpu_uuid="G5",mig_uuid="",'
            'pod_uid="u2",container="main"}': "1x40",
            'numaguard_gpu_pcie_bytes_per_second{node="n1",gpu="5",gpu_uuid="G5",'
            'direction="tx"}': "1e6x40",
            # split: its GPUs in two containers as well, moving as much: the spec is the fix
            'numaguard_pod_gpu_link_poor{node="n1",namespace="ml",pod="split",pod_uid="u3",'
            'reason="no_p2p"}': "1x40",
            'numaguard_pod_gpu_link_poor{node="n1",namespace="ml",pod="split",pod_uid="u3",'
            'reason="split_containers"}': "1x40",
            'numaguard_gpu_holder_info{node="n1",gpu="6",gpu_uuid="G6",mig_uuid="",'
            'pod_uid="u3",container="a"}': "1x40",
            'numaguard_gpu_pcie_bytes_per_second{node="n1",gpu="6",gpu_uuid="G6",'
            'direction="tx"}': "2e9x40",
        },
        [
            ("9m", []),
            ("10m", [{**N, "namespace": "ml", "pod": "far", "pod_uid": "u1", "reason": "no_p2p"}]),
        ],
    ),
    "NumaguardExclusiveCPUsShareABusyCore": (
        {
            # odd: a core shared, its sibling busy 80 % of the time
            'numaguard_pod_core_isolation{node="n1",namespace="ml",pod="odd",pod_uid="u1",'
            'reason="smt_shared"}': "1x40",
            'numaguard_pod_smt_sibling_busy_ratio{node="n1",namespace="ml",pod="odd",'
            'pod_uid="u1"}': "0.8x40",
            # quiet: as shared, its sibling idle: no harm done
            'numaguard_pod_core_isolation{node="n1",namespace="ml",pod="quiet",pod_uid="u2",'
            'reason="smt_shared"}': "1x40",
            'numaguard_pod_smt_sibling_busy_ratio{node="n1",namespace="ml",pod="quiet",'
            'pod_uid="u2"}': "0.05x40",
            # whole: whole cores; a busy ratio left over from before it was fixed
            'numaguard_pod_core_isolation{node="n1",namespace="ml",pod="whole",pod_uid="u3",'
            'reason="smt_shared"}': "0x40",
            'numaguard_pod_smt_sibling_busy_ratio{node="n1",namespace="ml",pod="whole",'
            'pod_uid="u3"}': "0.9x40",
        },
        [
            ("9m", []),
            (
                "10m",
                [{**N, "namespace": "ml", "pod": "odd", "pod_uid": "u1", "reason": "smt_shared"}],
            ),
        ],
    ),
    "NumaguardUnremediableFindingsPiling": (
        {"numaguard_remediator_unremediable_findings": "6x40"},
        [("29m", []), ("31m", [{}])],
    ),
}


# alerts whose series keep the exporter's labels, job among them
KEEP_JOB = {
    "NumaguardMultiGPUPodWithoutP2P",
    "NumaguardExclusiveCPUsShareABusyCore",
    "NumaguardPodCrossNUMA",
    "NumaguardGPUStarved",
    "NumaguardMIGSliceOversized",
    "NumaguardMIGSliceUndersized",
    "NumaguardRMIDsExhausted",
    "NumaguardDRAClaimsAndGPUInstancesDisagree",
    "NumaguardCollectorFailing",
    "NumaguardExporterStale",
}


def _scraped(series: str) -> str:
    """An exporter series as Prometheus stores it: with the scrape job."""
    if not series.startswith("numaguard_") or series.startswith("numaguard_remediator_"):
        return series
    if "job=" in series:
        return series
    name, _, rest = series.partition("{")
    return f'{name}{{job="{EXPORTER_JOB}",{rest}'


def test_generated_rules_and_runbooks_are_current():
    assert rules.RULES_FILE.read_text() == rules.rules_yaml(), "run: make docs"
    for a in rules.ALERTS:
        assert (rules.RUNBOOKS / f"{a.name}.md").read_text() == rules.runbook(a), "make docs"


@pytest.mark.parametrize("version", VERSIONS)
def test_promtool_check_rules_is_clean(version):
    check = subprocess.run(
        [binary("promtool", version), "check", "rules", str(rules.RULES_FILE)],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(rules.RECORDING) + len(rules.ALERTS)} rules found" in check.stdout


def test_every_rule_names_only_known_metrics_and_has_what_on_call_needs():
    known = series_names() | set(rules.RECORDING) | {"up"}  # up: Prometheus's own
    names = {a.name for a in rules.ALERTS}
    assert len(names) == len(rules.ALERTS)
    for expr in [*rules.RECORDING.values(), *(a.expr for a in rules.ALERTS)]:
        assert metric_names(expr) <= known, (expr, metric_names(expr) - known)
    for a in rules.ALERTS:
        assert a.severity in ("critical", "warning", "info")
        assert a.summary and a.description and a.meaning and a.action
        url = rules.RUNBOOK_URL.format(a.name)
        path = url.split("/blob/main/", 1)[1]
        assert (Path(rules.ROOT) / path).is_file(), url


def test_every_aggregation_keeps_the_cluster():
    """Evaluated over a view of several clusters (a Thanos ruler, a global view), an
    aggregation by node must not merge two clusters' nodes of one name: every by and on
    list names cluster (or an aggregation keeps every label but some, with without)."""
    for expr in [*rules.RECORDING.values(), *(a.expr for a in rules.ALERTS)]:
        for clause in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr):
            labels = {label.strip() for label in clause.split(",")}
            # the remediator's own detection keys series by exporter target (instance),
            # which no two clusters share
            assert "cluster" in labels or "instance" in labels, (expr, clause)


def test_every_alert_has_unit_cases():
    assert set(CASES) == {a.name for a in rules.ALERTS}


def _annotations(alert: rules.Alert, labels: dict) -> dict:
    def fill(text: str) -> str:
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m[1], ""), text)

    return {
        "summary": fill(alert.summary),
        "description": fill(alert.description),
        "runbook_url": rules.RUNBOOK_URL.format(alert.name),
        "dashboard_uid": alert.dashboard,
    }


def promtool_test(version: str, tmp_path, series: dict[str, str], checks: list[dict]) -> None:
    """`promtool test rules` of the generated rules on ``series`` (1m apart), with these
    alert_rule_test entries."""
    test = {
        "rule_files": [str(rules.RULES_FILE)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "alert_rule_test": checks,
            }
        ],
    }
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    run = subprocess.run(
        [binary("promtool", version), "test", "rules", str(path)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("alert", rules.ALERTS, ids=lambda a: a.name)
def test_promtool_unit_tests(alert, version, tmp_path):
    series, checks = CASES[alert.name]
    series = {_scraped(text): values for text, values in series.items()}
    job = {"job": EXPORTER_JOB} if alert.name in KEEP_JOB else {}
    checks = [(at, [{**job, **labels} for labels in expected]) for at, expected in checks]
    promtool_test(
        version,
        tmp_path,
        series,
        [
            {
                "eval_time": at,
                "alertname": alert.name,
                "exp_alerts": [
                    {
                        "exp_labels": {**labels, "severity": alert.severity},
                        "exp_annotations": _annotations(alert, labels),
                    }
                    for labels in expected
                ],
            }
            for at, expected in checks
        ],
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_an_exporters_only_install_raises_no_remediator_alert(version, tmp_path):
    """The chart's remediator.enabled=false: exporters up and well, no remediator series
    at all. Nothing fires, NoLeader included, at any time."""
    series = {
        'up{job="numaguard",instance="n1:9847"}': "1x90",
        'numaguard_collector_success{job="numaguard",node="n1",collector="gpu"}': "1x90",
        'numaguard_collector_last_success_timestamp_seconds{job="numaguard",node="n1",'
        'collector="gpu"}': "0+60x90",
    }
    quiet = [
        {"eval_time": at, "alertname": a.name, "exp_alerts": []}
        for a in rules.ALERTS
        for at in ("15m", "90m")
    ]
    promtool_test(version, tmp_path, series, quiet)
