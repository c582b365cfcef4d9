"""What the remediator's end-to-end tests share: its components' kubeconfigs through
fault proxies, the Leases left behind, and cycles run until something is done."""

from __future__ import annotations

import asyncio
import time

from numaguard.simulator.parts.controlplane import ControlPlane, path_of


async def component_kubeconfigs(cp: ControlPlane, stack, directory):
    """The exporter's and the remediator's kubeconfigs: each its ServiceAccount's token,
    through its own fault proxy. Returns (exporter's, remediator's, remediator's proxy)."""
    paths = []
    for account in ("numaguard-exporter", "numaguard-remediator"):
        proxy = await stack.enter_async_context(cp.fault_proxy())
        path = directory / f"{account}.kubeconfig"
        paths.append(cp.kubeconfig(path, cp.tokens[account], account, server=proxy.url))
    return paths[0], paths[1], proxy


async def forget_leases(cp: ControlPlane, session) -> None:
    """Leader-election Leases live in deploy/'s namespace, which outlives each cluster."""
    for lease in await cp.items(session, "Lease", "numaguard"):
        name = lease["metadata"]["name"]
        await cp.request(session, "DELETE", path_of("Lease", "numaguard", name))


async def cycles_until(controller, done, timeout=120.0):
    deadline = time.monotonic() + timeout
    reports = []
    while time.monotonic() < deadline:
        reports.append(await controller.cycle())
        if done(reports):
            return reports
        await asyncio.sleep(1)
    said = [
        (
            r.results,
            [(x.finding.pod, x.guard, x.detail) for x in r.plan.refusals] if r.plan else [],
            r.verified,
            r.error,
        )
        for r in reports[-3:]
    ]
    raise AssertionError(f"not done in {timeout}s; the last cycles: {said}")
