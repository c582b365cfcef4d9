"""The remediator's settings: its config file's sections with the flags over them,
validated as a whole (pydantic), a wrong value named with what is allowed."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import typing
from dataclasses import fields, replace

import yaml
from pydantic import TypeAdapter, ValidationError

from numaguard.remediator.core.findings import Detection
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import Windows
from numaguard.remediator.signals import Source

SECTIONS = {"policy": Policy, "detection": Detection, "windows": Windows, "prometheus": Source}


# flag (argparse dest) -> (config section, key) it overrides
FLAGS = {
    "max_per_cycle": ("policy", "max_per_cycle"),
    "max_per_node": ("policy", "max_per_node"),
    "max_per_namespace": ("policy", "max_per_namespace"),
    "min_pod_age": ("policy", "min_pod_age_seconds"),
    "verify_after": ("policy", "verify_after_seconds"),
    "finding_window": ("windows", "finding"),
    "selector": ("prometheus", "selector"),
    "cluster": ("prometheus", "cluster"),
}


class ConfigError(Exception):
    pass


def settings(args: argparse.Namespace) -> tuple[Policy, Detection, Windows, Source]:
    """The config file's sections with the flags over them, validated as a whole: a
    wrong value is a ConfigError naming the key, the value and what is allowed."""
    sections: dict[str, dict] = {name: {} for name in SECTIONS}
    where = args.config or "flags"
    if args.config:
        try:
            with open(args.config) as f:
                loaded = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"{args.config}: {err}") from None
        if not isinstance(loaded, dict) or set(loaded) - set(SECTIONS):
            raise ConfigError(f"{args.config}: top-level keys must be among {sorted(SECTIONS)}")
        for section, values in loaded.items():
            if not isinstance(values, dict):
                raise ConfigError(f"{args.config}: {section} must be a mapping, got {values!r}")
            sections[section] = dict(values)
    for flag, (section, key) in FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            sections[section][key] = value
    for flag, key in (("enforce", "enforcement"), ("min_fix_gain", "min_fix_gain")):
        for kind, value in getattr(args, flag, None) or ():
            sections["policy"].setdefault(key, {})
            if isinstance(sections["policy"][key], dict):  # else pydantic says why
                sections["policy"][key][kind] = value
    if getattr(args, "dry_run", None) is not None:  # `run --dry-run` / `--no-dry-run`
        sections["policy"]["dry_run"] = args.dry_run
    built, problems = {}, []
    for name, cls in SECTIONS.items():
        try:
            built[name] = TypeAdapter(cls).validate_python(sections[name])
        except ValidationError as err:
            problems += [_problem(name, e, cls) for e in err.errors()]
    if problems:
        raise ConfigError(f"{where}: {'; '.join(problems)}")
    policy = built["policy"]
    # its own namespace (where it is installed, with the exporters) is never acted in
    own = [os.environ["POD_NAMESPACE"]] if os.environ.get("POD_NAMESPACE") else []
    if args.protected_namespace or own:
        protected = (*policy.protected_namespaces, *(args.protected_namespace or ()), *own)
        policy = replace(policy, protected_namespaces=protected)
    return policy, built["detection"], built["windows"], built["prometheus"]


def _problem(section: str, error: dict, record: type) -> str:
    """One validation error, named by where it is (one across a section's fields, its
    __post_init__, by the section), in words a user can act on."""
    message = error["msg"].removeprefix("Value error, ")
    if not error["loc"]:
        return f"{section}: {message}"
    where = f"{section}.{'.'.join(map(str, error['loc']))}"
    if error["type"] == "unexpected_keyword_argument":
        for part in error["loc"][:-1]:  # the record the key was given to
            record = typing.get_type_hints(record).get(part)
        keys = [f.name for f in fields(record)] if dataclasses.is_dataclass(record) else []
        near = difflib.get_close_matches(str(error["loc"][-1]), keys, n=1)
        hint = f"did you mean {near[0]}?" if near else f"the keys are {', '.join(keys)}"
        return f"{where}: no such setting ({hint})"
    return f"{where}: {message} (got {error['input']!r})"
