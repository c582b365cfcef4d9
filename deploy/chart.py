"""The chart's values.schema.json and README.md, both from values.yaml: the schema takes
each key's type from its default and refuses keys the file does not have (a typo'd
value is an error at install, not silently ignored); the README lists every key with
its default and the comment above or beside it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent / "helm" / "numaguard"
# values whose keys are the user's or Kubernetes' own (labels, a pod's scheduling, a
# container's security context)
FREE_FORM = re.compile(
    r"(^|\.)(commonLabels|annotations|nodeSelector|affinity|podAnnotations|podLabels"
    r"|podSecurityContext|securityContext|resources|updateStrategy|additionalLabels"
    r"|tlsConfig|basicAuth)$"
)
# the remediator's config file: its own records' schema (pydantic's), so that a typo'd
# or wrong setting fails `helm install`, not the remediator's start in a crash loop
REMEDIATOR_CONFIG = "remediator.config"
ENUMS = {"image.pullPolicy": ["", "Always", "IfNotPresent", "Never"]}
POSITIVE = {"exporter.memoryMoverHelper.rate"}  # 0 would not start
# a switch that needs another value set
REQUIRED_WHEN_ON = {"networkPolicy": ("enabled", "prometheusNamespace")}


def _schema(value, path: str) -> dict:
    if path == REMEDIATOR_CONFIG:
        return {"$ref": "#/definitions/RemediatorConfig"}
    if isinstance(value, dict):
        if FREE_FORM.search(path):
            return {"type": "object"}
        node = {
            "type": "object",
            "additionalProperties": False,
            "properties": {k: _schema(v, f"{path}.{k}".lstrip(".")) for k, v in value.items()},
        }
        if path in REQUIRED_WHEN_ON:
            switch, needed = REQUIRED_WHEN_ON[path]
            node["if"] = {"properties": {switch: {"const": True}}, "required": [switch]}
            node["then"] = {"properties": {needed: {"minLength": 1}}}
        return node
    if isinstance(value, list):
        return {"type": "array"}
    if path in ENUMS:
        return {"enum": ENUMS[path]}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer", "minimum": int(path in POSITIVE)}
    if isinstance(value, str):
        return {"type": "string"}
    raise TypeError(f"{path}: no schema for {value!r}")


def values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def schema() -> str:
    doc = {"$schema": "http://json-schema.org/draft-07/schema#", **_schema(values(), "")}
    doc["definitions"] = _remediator_config()
    return json.dumps(doc, indent=2) + "\n"


def _remediator_config() -> dict:
    """The config file's sections as numaguard-remediator validates them, their shared
    records hoisted to the document's definitions."""
    from pydantic import TypeAdapter

    from numaguard.remediator.config import SECTIONS

    definitions, sections = {}, {}
    for name, record in SECTIONS.items():
        section = TypeAdapter(record).json_schema(ref_template="#/definitions/{model}")
        definitions.update(section.pop("$defs", {}))
        sections[name] = section
    config = {"type": "object", "additionalProperties": False, "properties": sections}
    return {**definitions, "RemediatorConfig": config}


def _comments() -> dict[str, str]:
    """Dotted key -> the comment lines just above it and the one beside it."""
    out, stack, above = {}, [], []
    for line in (CHART / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        found = re.match(r"^( *)([A-Za-z]\w*):(.*)$", line)
        if not found:
            above = [] if not stripped else above
            continue
        depth = len(found[1]) // 2
        stack[depth:] = [found[2]]
        beside = found[3].split(" # ", 1)[1].strip() if " # " in found[3] else ""
        out[".".join(stack)] = " ".join([*above, beside]).strip()
        above = []
    return out


def _leaves(value, path: str):
    if (
        isinstance(value, dict)
        and value
        and not FREE_FORM.search(path)
        and path != REMEDIATOR_CONFIG
    ):
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}".lstrip("."))
    else:
        yield path, value


def readme() -> str:
    comments = _comments()
    head = (CHART / "README.head.md").read_text()
    rows = ["| key | default | what it does |", "|---|---|---|"]
    for path, default in _leaves(values(), ""):
        shown = json.dumps(default, separators=(", ", ": "))
        text = comments.get(path, "").replace("|", "/")
        rows.append(f"| `{path}` | `{shown}` | {text} |")
    return head + "\n".join(rows) + "\n"
