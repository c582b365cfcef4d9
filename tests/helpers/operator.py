"""deploy/'s objects at the test's pace, and the names the Prometheus Operator gives
their job."""

from __future__ import annotations

from alerts import rules
from numaguard.remediator.core.queries import Windows

MONITORING = "monitoring"


JOB = "serviceMonitor/numaguard/numaguard/0"  # the operator's name for the exporter's job


WINDOW = "5s"


def quick(objects: list[dict]) -> list[dict]:
    """deploy/'s objects with the test's pace: the exporter scraped every second and the
    rules' windows seconds long (as every alert test shortens them); nothing else
    changes."""
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            for endpoint in obj["spec"]["endpoints"]:
                endpoint["interval"] = "1s"
        if obj["kind"] == "PrometheusRule":
            obj["spec"] = rules.rules_document(Windows(WINDOW, WINDOW))
    return objects
