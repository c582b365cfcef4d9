"""The placement map as a page (pure): one self-contained HTML document with an inline
SVG and no script, font or request of its own (clusters are often offline), drawing a
node's sockets -> NUMA nodes -> L3 caches -> CPUs, each exclusive CPU in the colour of
the pod holding it; each NUMA node's memory as a bar split by pod; its GPUs under it,
their MIG slices by placement in their holders' colours; a line from each pod to its
devices; and every pod with a verdict outlined in the verdict's colour, named with the
reason in words in the legend. Hovering a CPU, a slice or a legend row shows the pod.

The elements carry what a reader (or a test) looks up: ``data-numa-node`` on a NUMA
node's group (its GPUs' groups, ``data-gpu``, inside it), ``data-cpu`` and ``data-pod``
on each CPU, ``data-pod`` on each device held, ``data-verdict`` on whatever is outlined.
"""

from __future__ import annotations

import html
import math

CPU, GAP = 12, 2  # a CPU's square and the space between
COLUMNS = 8  # CPUs a row within an L3 cache
SLOTS = 8  # a GPU's memory slices, which MIG placements count in
PAD = 8
# a verdict's kind -> its outline colour, and the legend's order
VERDICT_COLOURS = {
    "cross_numa": "#d62728",
    "starved": "#ff7f0e",
    "gpu_link": "#1f77b4",
    "core_isolation": "#9467bd",
}
SHARED_POOL, RESERVED = "#e8e8e8", "#6b6b6b"
STYLE = """
body{font:13px sans-serif;margin:16px;color:#222}
h1{font-size:18px;margin:0 0 4px}
.muted{color:#666}
svg text{font:11px sans-serif}
table{border-collapse:collapse;margin-top:12px}
td,th{padding:2px 8px;text-align:left;vertical-align:top;border-bottom:1px solid #eee}
.swatch{display:inline-block;width:12px;height:12px;border:1px solid #999}
.warning{color:#b00}
"""


def colour(index: int) -> str:
    """The ``index``-th pod's colour: hues a golden angle apart, never the pool's grey."""
    return f"hsl({(index * 137.508) % 360:.0f},65%,55%)"


def render(placement: dict) -> str:
    """The page for ``placement`` (model/placement_map.py's data)."""
    pods = placement["pods"]
    colours = {uid: colour(i) for i, uid in enumerate(sorted(pods, key=lambda u: _name(pods[u])))}
    titles = {uid: _title(pod) for uid, pod in pods.items()}
    outlined = {uid: _outline(pod) for uid, pod in pods.items()}
    known = placement.get("pods_known", True)
    svg, width, height, anchors = _svg(placement, colours, titles, outlined, known)
    node = html.escape(placement["node"])
    return "".join(
        [
            # an icon of its own, inline: a browser asks the server for none
            "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<link rel='icon' href='data:,'>",
            f"<title>numaguard: placement on {node}</title><style>{STYLE}</style></head><body>",
            f"<h1>Placement on {node}</h1>",
            f"<p class='muted'>At {placement['time']:.0f} (Unix time), as the exporter's last "
            "cycle read it. Exclusive CPUs in their pod's colour; the shared pool light grey, "
            "the kubelet's reserved CPUs dark grey; pods with a verdict outlined in its "
            "colour. Hover over a CPU or a device for its pod.</p>",
            ""
            if known
            else "<p class='warning' data-pods-unknown='true'>The pods' cgroups were not read "
            "this cycle: no CPU's holder is known, and none is drawn (white).</p>",
            f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' role='img'>",
            svg,
            _lines(anchors, colours),
            "</svg>",
            _legend(pods, colours, titles),
            "</body></html>",
        ]
    )


def _name(pod: dict) -> str:
    return f"{pod['namespace']}/{pod['name']}"


def _title(pod: dict) -> str:
    cpus = ", ".join(f"node {n}: {k}" for n, k in sorted(pod["cpus_by_numa_node"].items()))
    memory = ", ".join(
        f"node {n}: {b / 2**30:.1f} GiB" for n, b in sorted(pod["memory_by_numa_node"].items())
    )
    lines = [
        _name(pod),
        f"exclusive CPUs per NUMA node: {cpus or 'none'}",
        f"memory per NUMA node: {memory or 'unknown'}",
        f"devices: {', '.join(pod['devices']) or 'none'}",
        *(v["words"] for v in pod["verdicts"]),
    ]
    return "\n".join(lines)


def _outline(pod: dict) -> tuple[str, str] | None:
    """(colour, kind) of the pod's first verdict by the legend's order, or None."""
    kinds = {v["kind"] for v in pod["verdicts"]}
    for kind, stroke in VERDICT_COLOURS.items():
        if kind in kinds:
            return stroke, kind
    return None


def _svg(placement: dict, colours, titles, outlined, known: bool):
    """The drawing, its size, and where each pod's first CPU and each device held are
    (page coordinates), for the lines between them."""
    by_id = {n["numa_node"]: n for n in placement["numa_nodes"]}
    columns = [(f"socket {s['socket']}", s["numa_nodes"]) for s in placement["sockets"]]
    placed = {n for _, ids in columns for n in ids}
    if set(by_id) - placed:
        columns.append(("NUMA nodes on no one socket", sorted(set(by_id) - placed)))
    parts: list[str] = []
    anchors: dict[str, dict] = {"pods": {}, "devices": {}}
    x = height = PAD
    for label, ids in columns:
        inner: list[str] = [f"<text x='{PAD}' y='{PAD + 10}'>{html.escape(label)}</text>"]
        y, width = PAD + 18, 0.0
        for n in ids:
            origin = (x + PAD, y)
            drawing, w, h = _numa(by_id[n], colours, titles, outlined, anchors, origin, known)
            inner.append(f"<g transform='translate({PAD},{y})'>{drawing}</g>")
            y, width = y + h + PAD, max(width, w)
        parts.append(
            f"<g data-socket='{html.escape(label)}' transform='translate({x},0)'>"
            f"<rect y='{PAD / 2}' width='{width + 2 * PAD}' height='{y}' fill='none' "
            f"stroke='#bbb' rx='6'/>" + "".join(inner) + "</g>"
        )
        x += width + 3 * PAD
        height = max(height, y + PAD)
    for gpu in placement.get("gpus_on_no_numa_node", []):
        drawing, w, _ = _gpu(gpu, colours, titles, outlined, anchors, (x, PAD))
        parts.append(f"<g transform='translate({x},{PAD})'>{drawing}</g>")
        x += w + PAD
    return "".join(parts), x, height, anchors


def _numa(node: dict, colours, titles, outlined, anchors, origin, known: bool):
    """A NUMA node's box drawn at ``origin`` (page coordinates): its drawing, width and
    height."""
    n, (ox, oy) = node["numa_node"], origin
    caches = node["l3_caches"] or [{"id": None, "cpus": [c["cpu"] for c in node["cpus"]]}]
    cpu_of = {c["cpu"]: c for c in node["cpus"]}
    # the SLIT row, in node order: 10 is its own
    distances = "distances " + " ".join(str(d) for d in node["distances"].values())
    parts = [
        f"<text x='0' y='10'>NUMA node {n}</text>",
        f"<text x='0' y='22' fill='#666'>{html.escape(distances)}</text>",
    ]
    y, x, row_height = 28, 0, 0
    for cache in caches:
        rows = max(1, math.ceil(len(cache["cpus"]) / COLUMNS))
        w = COLUMNS * (CPU + GAP) + GAP + 2
        h = rows * (CPU + GAP) + GAP + 14
        name = f"L3 {cache['id']}" if cache["id"] is not None else "CPUs"
        cells = [f"<text x='2' y='10' fill='#666'>{name}</text>"]
        for k, cpu in enumerate(cache["cpus"]):
            cx, cy = 2 + GAP + (k % COLUMNS) * (CPU + GAP), 14 + (k // COLUMNS) * (CPU + GAP)
            entry = cpu_of.get(cpu, {"cpu": cpu})
            cells.append(_cpu(entry, cx, cy, colours, titles, outlined, known))
            holder = entry.get("holder")
            if holder and holder not in anchors["pods"]:
                anchors["pods"][holder] = (ox + x + cx + CPU / 2, oy + y + cy + CPU / 2)
        parts.append(
            f"<g data-l3='{cache['id']}' transform='translate({x},{y})'>"
            f"<rect width='{w}' height='{h}' fill='none' stroke='#ddd' rx='3'/>"
            + "".join(cells)
            + "</g>"
        )
        x += w + GAP * 2
        row_height = max(row_height, h)
    width = max(x, 2 * (COLUMNS * (CPU + GAP)), 6 * len(distances))
    y += row_height + 6
    names = {uid: title.split("\n", 1)[0] for uid, title in titles.items()}
    bar, bar_height = _memory_bar(node, width, colours, names, outlined)
    parts.append(f"<g transform='translate(0,{y})'>{bar}</g>")
    y += bar_height + 6
    gx, gpu_height = 0, 0
    for gpu in node["gpus"]:
        drawing, w, h = _gpu(gpu, colours, titles, outlined, anchors, (ox + gx, oy + y))
        parts.append(f"<g transform='translate({gx},{y})'>{drawing}</g>")
        gx, gpu_height = gx + w + GAP * 2, max(gpu_height, h)
        width = max(width, gx)
    y += gpu_height
    box = (
        f"<g data-numa-node='{n}'>"
        f"<rect x='-4' y='-4' width='{width + 8}' height='{y + 8}' fill='#fafafa' "
        f"stroke='#999' rx='4'/>" + "".join(parts) + "</g>"
    )
    return box, width + 8, y + 8


def _cpu(cpu: dict, x: float, y: float, colours, titles, outlined, known: bool) -> str:
    holder = cpu.get("holder", "")
    attrs = f"data-cpu='{cpu['cpu']}'"
    if holder:
        fill = colours.get(holder, SHARED_POOL)
        attrs += f" data-pod='{html.escape(holder)}'"
        title = f"CPU {cpu['cpu']}: {titles.get(holder, holder)}"
    elif cpu.get("reserved"):
        fill, title = RESERVED, f"CPU {cpu['cpu']}: reserved by the kubelet"
        attrs += " data-reserved='true'"
    elif not known:
        fill, title = "#fff", f"CPU {cpu['cpu']}: holder unknown (the pods were not read)"
    else:
        fill, title = SHARED_POOL, f"CPU {cpu['cpu']}: shared pool"
    stroke = "#999"
    width = 0.5
    if holder and outlined.get(holder):
        stroke, kind = outlined[holder]
        attrs += f" data-verdict='{kind}'"
        width = 2
    return (
        f"<rect {attrs} x='{x}' y='{y}' width='{CPU}' height='{CPU}' fill='{fill}' "
        f"stroke='{stroke}' stroke-width='{width}'><title>{html.escape(title)}</title></rect>"
    )


def _memory_bar(node: dict, width: float, colours, names, outlined) -> tuple[str, float]:
    total = node.get("memory_total_bytes")
    if not total:
        return "<text x='0' y='10' fill='#666'>memory not read</text>", 12
    free = node.get("memory_free_bytes", 0)
    parts = [
        f"<text x='0' y='10' fill='#666'>memory {total / 2**30:.0f} GiB, "
        f"{free / 2**30:.0f} GiB free</text>",
        f"<rect y='14' width='{width}' height='10' fill='#fff' stroke='#999'/>",
    ]
    x = 0.0
    # a pod's share too thin to see or point at (under a pixel) goes with the others'
    least = total / width
    segments = [(uid, b) for uid, b in sorted(node["memory_by_pod"].items()) if b >= least]
    other = node.get("memory_other_pods_bytes", 0)
    other += sum(b for b in node["memory_by_pod"].values() if b < least)
    segments.append(("", other))
    for uid, size in segments:
        w = width * size / total
        if w <= 0:
            continue
        fill = colours.get(uid, SHARED_POOL) if uid else "#c9c9c9"
        # the pod's name only: its whole account is on its CPUs and its legend row
        title = names.get(uid, uid) if uid else "other pods (each under a pixel here)"
        data = f" data-pod='{html.escape(uid)}'" if uid else ""
        stroke = ""
        if uid and outlined.get(uid):
            colour_, kind = outlined[uid]
            data += f" data-verdict='{kind}'"
            stroke = f" stroke='{colour_}' stroke-width='1.5'"
        parts.append(
            f"<rect{data} x='{x:.1f}' y='14' width='{w:.1f}' height='10' fill='{fill}'{stroke}>"
            f"<title>{html.escape(title)}: {size / 2**30:.1f} GiB</title></rect>"
        )
        x += w
    return "".join(parts), 26


def _gpu(gpu: dict, colours, titles, outlined, anchors, origin) -> tuple[str, float, float]:
    w, h = SLOTS * 10 + 4, 34
    label = f"GPU {gpu['index']}"
    parts = [
        f"<rect width='{w}' height='{h}' fill='#fff' stroke='#555' rx='3'/>",
        f"<text x='2' y='10'>{html.escape(label)}</text>",
    ]
    units = gpu["slices"] if gpu["mig"] else [{**gpu, "start": 0, "size": SLOTS}]
    for unit in units:
        if unit.get("start") is None or unit.get("size") is None:
            continue  # a slice whose placement NVML did not say: not drawn where it is not
        holder = unit["holder"]
        fill = colours.get(holder, "#f4f4f4") if holder else "#f4f4f4"
        x, width = 2 + unit["start"] * 10, unit["size"] * 10
        attrs = f"data-device='{html.escape(unit['uuid'])}'"
        stroke, stroke_width = "#999", 0.5
        if holder:
            attrs += f" data-pod='{html.escape(holder)}'"
            if outlined.get(holder):
                stroke, kind = outlined[holder]
                attrs += f" data-verdict='{kind}'"
                stroke_width = 2
        name = unit.get("profile") or gpu["model"]
        title = f"{label} {name}: " + (titles.get(holder, holder) if holder else "free")
        parts.append(
            f"<rect {attrs} x='{x}' y='14' width='{width - 1}' height='16' fill='{fill}' "
            f"stroke='{stroke}' stroke-width='{stroke_width}'>"
            f"<title>{html.escape(title)}</title></rect>"
        )
        if holder:
            gx, gy = origin
            anchors["devices"][unit["uuid"]] = (holder, gx + x + width / 2, gy + 22)
    return (
        f"<g data-gpu='{gpu['index']}' data-gpu-uuid='{html.escape(gpu['uuid'])}'>"
        + "".join(parts)
        + "</g>",
        w,
        h,
    )


def _lines(anchors: dict, colours) -> str:
    """A line from each pod's first CPU to each of its devices, in its colour."""
    out = []
    for uuid, (holder, x2, y2) in sorted(anchors["devices"].items()):
        if holder in anchors["pods"]:
            x1, y1 = anchors["pods"][holder]
            out.append(
                f"<line data-pod='{html.escape(holder)}' data-to='{html.escape(uuid)}' "
                f"x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' "
                f"stroke='{colours.get(holder, '#999')}' stroke-opacity='0.35'/>"
            )
    return "".join(out)


def _legend(pods: dict, colours, titles) -> str:
    rows = []
    for uid in sorted(pods, key=lambda u: (not pods[u]["verdicts"], _name(pods[u]))):
        pod = pods[uid]
        verdicts = "; ".join(
            f"<span data-verdict='{v['kind']}' "
            f"style='color:{VERDICT_COLOURS.get(v['kind'], '#000')}'>"
            f"{html.escape(v['words'])}</span>"
            for v in pod["verdicts"]
        )
        mark = _outline(pod)
        outline = f" data-verdict='{mark[1]}' style='outline:2px solid {mark[0]}'" if mark else ""
        rows.append(
            f"<tr data-pod='{html.escape(uid)}'{outline} title='{html.escape(titles[uid])}'>"
            f"<td><span class='swatch' style='background:{colours[uid]}'></span></td>"
            f"<td>{html.escape(_name(pod))}</td><td>{verdicts or '—'}</td></tr>"
        )
    kinds = "".join(
        f"<li><span class='swatch' style='border:2px solid {c}'></span> {k.replace('_', ' ')}</li>"
        for k, c in VERDICT_COLOURS.items()
    )
    return (
        f"<h2>Legend</h2><ul>{kinds}<li><span class='swatch' style='background:{SHARED_POOL}'>"
        f"</span> shared pool</li><li><span class='swatch' style='background:{RESERVED}'></span>"
        " reserved</li></ul>"
        "<table><tr><th></th><th>pod</th><th>verdicts</th></tr>" + "".join(rows) + "</table>"
    )
