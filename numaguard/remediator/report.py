"""One cycle's report as ``plan`` prints it: a table for people, JSON for tools."""

from __future__ import annotations

import json

from numaguard.remediator.core.cycle_report import CycleReport
from numaguard.remediator.core.rejections import describe


def render(report: CycleReport, output: str) -> str:
    return _json(report) if output == "json" else _table(report)


def _json(report: CycleReport) -> str:
    return json.dumps(
        {
            "error": report.error,
            "warning": report.warning,
            "findings": [vars(f) for f in report.findings],
            "actions": [
                {
                    "kind": a.kind,
                    "pod": f"{a.finding.namespace}/{a.finding.pod}",
                    "finding": a.finding.kind,
                    "reason": a.finding.reason,
                    "detail": a.detail,
                    "dry_run": a.dry_run,
                }
                for a in (report.plan.actions if report.plan else ())
            ],
            "refusals": [
                {
                    "pod": f"{r.finding.namespace}/{r.finding.pod}",
                    "finding": r.finding.kind,
                    "reason": r.finding.reason,
                    "guard": r.guard,
                    "detail": r.detail,
                }
                for r in (report.plan.refusals if report.plan else ())
            ],
            "rejected_pods": [
                {
                    "workload": st.workload,
                    "node": st.node,
                    "reason": st.reason,
                    "pods": len(st.pods),
                    "delete": [p.name for p in st.delete],
                    "held_back": st.guard,
                    "fits_on": list(st.fit) if st.fit else None,
                }
                for st in report.storms
            ],
            "ignored": [
                {
                    "pod": f"{f.namespace}/{f.pod}",
                    "finding": f.kind,
                    "reason": f.reason,
                }
                for f in (report.plan.ignored if report.plan else ())
            ],
        },
        indent=1,
    )


def _table(report: CycleReport) -> str:
    if report.error:
        return f"no plan: {report.error}"
    lines = [f"warning: {report.warning}"] if report.warning else []
    lines.append(f"{len(report.findings)} findings")
    rows = [("pod", "finding", "decision", "why")]
    for a in report.plan.actions:
        rows.append(
            (
                f"{a.finding.namespace}/{a.finding.pod}",
                f"{a.finding.kind}:{a.finding.reason}",
                a.kind,
                a.detail,
            )
        )
    for r in report.plan.refusals:
        rows.append(
            (
                f"{r.finding.namespace}/{r.finding.pod}",
                f"{r.finding.kind}:{r.finding.reason}",
                f"refused ({r.guard})",
                r.detail,
            )
        )
    for f in report.plan.ignored:
        rows.append((f"{f.namespace}/{f.pod}", f"{f.kind}:{f.reason}", "ignored", "policy"))
    for st in report.storms:
        decision = f"delete {len(st.delete)}" if st.delete else f"keep ({st.guard or 'few'})"
        rows.append((st.workload, f"rejected:{st.reason}", decision, describe(st)))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        lines.append(
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[3]
        )
    return "\n".join(lines)
