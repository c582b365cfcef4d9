"""The decision page (pure): core/decisions.py's data as one self-contained HTML page, no
script or request of its own — the mode in large type at the top (dry run or acting,
paused or not, leader or not), then each finding with its evidence and decision (the
action and its target, or the guard and what would lift it), the pods the kubelet
refused, the actions awaiting verification and the latest outcomes. A dry run is
reviewed here in a minute instead of across Events."""

from __future__ import annotations

import html
import time

STYLE = """
body{font:13px sans-serif;margin:16px;color:#222}
.mode{font-size:28px;font-weight:bold;padding:8px 12px;border-radius:6px;display:inline-block}
.dry_run{background:#fff3cd}.acting{background:#f8d7da}.paused{background:#d6d8db}
.idle{background:#e2e3e5}
table{border-collapse:collapse;margin:8px 0 16px}
td,th{padding:3px 8px;text-align:left;vertical-align:top;border-bottom:1px solid #eee}
.refused{color:#8a6d3b}.acted{color:#155724}.muted{color:#666}.error{color:#b00}
"""


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _when(at: float | None) -> str:
    return "" if not at else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def mode_words(mode: dict) -> tuple[str, str]:
    """(the banner's words, its class)."""
    if not mode["leader"]:
        return "NOT THE LEADER: another replica decides", "idle"
    if mode["paused"]:
        return "PAUSED: nothing is changed", "paused"
    if mode["dry_run"]:
        return "DRY RUN: nothing is changed, every decision is said", "dry_run"
    return "ACTING: decisions are carried out", "acting"


def render(data: dict) -> str:
    words, kind = mode_words(data["mode"])
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<link rel='icon' href='data:,'>",
        f"<title>numaguard remediator: decisions</title><style>{STYLE}</style></head><body>",
        f"<div class='mode {kind}' data-mode='{kind}'>{_e(words)}</div>",
        f"<p class='muted'>The last cycle, at {_e(_when(data['at']))}.</p>",
    ]
    if data["error"]:
        parts.append(f"<p class='error' data-error='true'>Cycle skipped: {_e(data['error'])}</p>")
    if data["warning"]:
        parts.append(f"<p class='error'>{_e(data['warning'])}</p>")
    parts.append(f"<h2>Findings ({len(data['findings'])})</h2>")
    parts.append(
        _table(
            ("pod", "node", "finding", "evidence", "decision", "why", "what would lift it"),
            [
                (
                    f"{f['namespace']}/{f['pod']}",
                    f["node"],
                    f"{f['kind']}: {f['reason']}" + (f" ({f['device']})" if f["device"] else ""),
                    _evidence(f["evidence_age_seconds"]),
                    _decision(f),
                    f["detail"],
                    f.get("lifts", ""),
                )
                for f in data["findings"]
            ],
            row_data=[
                {"pod-uid": f["pod_uid"], "decision": f["decision"], "guard": f.get("guard", "")}
                for f in data["findings"]
            ],
        )
    )
    parts.append(f"<h2>Pods the kubelet refused ({len(data['rejected'])})</h2>")
    parts.append(
        _table(
            ("workload", "node", "reason", "pods", "decision"),
            [
                (r["workload"], r["node"], r["reason"], str(r["pods"]), r["said"])
                for r in data["rejected"]
            ],
        )
    )
    parts.append(f"<h2>Awaiting verification ({len(data['pending'])})</h2>")
    parts.append(
        _table(
            ("workload", "finding", "acted", "judged from", "deadline", "gain so far"),
            [
                (
                    p["workload"],
                    f"{p['kind']}: {p['reason']}" + (" (in place)" if p["in_place"] else ""),
                    _when(p["acted_at"]),
                    _when(p["judged_from"]),
                    _when(p["deadline"]),
                    "not measured yet"
                    if p["gain_so_far"] is None
                    else f"{p['gain_so_far']:.2f} ({p['gain_so_far_detail']})",
                )
                for p in data["pending"]
            ],
        )
    )
    parts.append(f"<h2>Latest outcomes ({len(data['outcomes'])})</h2>")
    parts.append(
        _table(
            ("when", "workload", "finding", "outcome", "gain", "what was measured"),
            [
                (
                    _when(o["at"]),
                    o["workload"],
                    o["kind"],
                    o["outcome"],
                    "" if o["gain"] is None else f"{o['gain']:.2f}",
                    o["detail"],
                )
                for o in data["outcomes"]
            ],
        )
    )
    parts.append("<p class='muted'>The same as JSON: ?format=json</p></body></html>")
    return "".join(parts)


def _evidence(age: float | None) -> str:
    return "no sample now" if age is None else f"verdict 1, newest sample {age:.0f}s old"


def _decision(f: dict) -> str:
    if f["decision"] == "refused":
        return f"refused: {f['guard']}"
    if f.get("dry_run"):
        return f"{f['decision']} (dry run)"
    return f["decision"]


def _table(head: tuple[str, ...], rows, row_data=None) -> str:
    if not rows:
        return "<p class='muted'>none</p>"
    out = ["<table><tr>", *(f"<th>{_e(h)}</th>" for h in head), "</tr>"]
    for i, row in enumerate(rows):
        attrs = ""
        if row_data is not None:
            attrs = "".join(f" data-{k}='{_e(v)}'" for k, v in row_data[i].items())
        out.append(f"<tr{attrs}>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)
