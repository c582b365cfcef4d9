"""The actuator: the only code that writes to the Kubernetes API. Evictions through the
Eviction API (so PodDisruptionBudgets hold), owner patches for opted-in MIG resizes, a
pod's request that its node move its memory home in place (an annotation on the pod),
the workload's history (an annotation on the workload, written before the action it
records), deletions of pods the kubelet refused for alignment beyond the few kept, the
steps of an opted-in MIG re-layout of a node (its cordon, MIG manager label and
annotation), and an Event for every action and refusal. Leadership is confirmed before each write,
Events included; in dry-run only Events are written, saying what would have
been done (as the descheduler's users asked: a dry run is watched where the cluster's
news is, ``kubectl get events``).

Its Writer holds the write verbs, and leader election writes its Lease through one too
(guarded by the Lease's resourceVersion, the only guard that can stand before
leadership exists): no other module can write. Dry run is enforced here, once, by
construction: the Writer of a dry run (and the elector's) writes Events and the
remediator's own objects (its Lease, its webhook's Secret and configuration) and refuses
every other write, whatever it is asked, as the descheduler's evictor in dry
run gets a client that cannot evict."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from numaguard.contract.names import (
    HISTORY_ANNOTATION,
    PENDING_LABEL,
    RELAYOUT_ANNOTATION,
    REPLACES_ANNOTATION,
    REQUEST_ANNOTATION,
    RESIZED_LABEL,
    mig_resource,
)
from numaguard.remediator.core.actions import Action, PodInfo, Refusal
from numaguard.remediator.core.claims import (
    RESOURCE_API,
    claim_profile,
    template_name,
    with_profile,
)
from numaguard.remediator.core.guards import HISTORY_OWNERS
from numaguard.remediator.core.history import DONE, WorkloadHistory
from numaguard.remediator.core.kinds import MIGRATE_MEMORY
from numaguard.remediator.core.rejections import RejectedPod
from numaguard.remediator.core.relayout import Step
from numaguard.remediator.core.steering import Steer, Target, configured
from numaguard.remediator.kube import Answer, Kube

log = logging.getLogger(__name__)
COMPONENT = "numaguard-remediator"
# actions whose history is written before they are taken (a resize writes it with the
# owner's patch itself)
RECORDED_FIRST = ("evict", MIGRATE_MEMORY)
_WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


# What a writer that does not act may still write: Events (saying what would have been
# done) and the remediator's own objects — leader election's Lease, and the steering
# webhook's Secret and configuration (which a dry run leaves without entries). Never a
# pod or a workload. (RBAC names which Lease, Secret and configuration.)
_WRITTEN_IN_DRY_RUN = re.compile(
    r"/api/v1/namespaces/[^/]+/events"
    r"|/apis/coordination\.k8s\.io/v1/namespaces/[^/]+/leases(/[^/]+)?"
    r"|/api/v1/namespaces/[^/]+/secrets/[^/]+"
    rf"|{_WEBHOOKS}/[^/]+"
)


# what makes pods from a template that may name a ResourceClaimTemplate
_POD_MAKERS = (
    ("apps/v1", "deployments"),
    ("apps/v1", "statefulsets"),
    ("apps/v1", "replicasets"),
    ("apps/v1", "daemonsets"),
    ("batch/v1", "jobs"),
    ("batch/v1", "cronjobs"),
)


class Writer:
    """The write verbs, over the client's reads. ``acting`` False (a dry run, and leader
    election's): only Events and the remediator's own objects are written; any other
    write is refused (HTTP status 0, reason DryRun) and logged as the defect it is."""

    def __init__(self, kube: Kube, acting: bool = False) -> None:
        self.kube = kube
        self.acting = acting

    async def post(self, path: str, body: dict) -> Answer:
        return await self._write("POST", path, body)

    async def put(self, path: str, body: dict) -> Answer:
        return await self._write("PUT", path, body)

    async def patch(self, path: str, body: dict) -> Answer:
        return await self._write("PATCH", path, body, "application/merge-patch+json")

    async def delete(self, path: str, body: dict) -> Answer:
        return await self._write("DELETE", path, body)

    async def _write(
        self, method: str, path: str, body: dict, content_type: str = "application/json"
    ) -> Answer:
        if not self.acting and not _WRITTEN_IN_DRY_RUN.fullmatch(path):
            log.error(
                "dry run: %s %s refused (numaguard's defect: nothing should ask it)",
                method,
                path,
                extra={"decision": "refused_write", "method": method, "path": path},
            )
            return Answer(0, {"reason": "DryRun"})
        return await self.kube.call(method, path, body=body, content_type=content_type)


class Elected(Protocol):
    """Whether this replica leads (leader.LeaderElector; it writes its Lease through the
    Writer above)."""

    leading: bool


class Actuator:
    def __init__(
        self, kube: Kube, elector: Elected | None, clock=time.time, dry_run: bool = True
    ) -> None:
        self.kube = kube
        self.writer = Writer(kube, acting=not dry_run)
        self.elector = elector
        self.clock = clock
        # SIGTERM: no new write is begun, only corrections of histories already written
        self.stopping: Callable[[], bool] = lambda: False

    def leading(self) -> bool:
        return self.elector is None or self.elector.leading

    async def act(self, action: Action, intent: WorkloadHistory | None = None) -> str:
        """Carry out one action; its result: evicted | resized | recommended | dry_run |
        pdb_blocked (429, retried in a later cycle) | failed | gone | not_leader |
        stopped (SIGTERM: not taken; a history written for it is the caller's to undo).
        ``intent``: the workload's history with this action in it, written first — an
        action whose record cannot be kept is not taken."""
        pod = action.pod
        if not self.leading():
            return "not_leader"
        if self.stopping():
            return "stopped"
        if action.kind == "recommend":
            await self.event(pod, "Recommendation", action.detail, "Normal")
            return "recommended"
        if action.dry_run:
            await self.event(pod, "DryRun", f"would {action.detail}", "Normal")
            return "dry_run"
        if intent is not None and action.kind in RECORDED_FIRST:
            recorded = await self.record(pod.workload, intent)
            if recorded != "ok":
                return recorded
        if not self.leading():
            return "not_leader"
        if self.stopping():  # between the record and the eviction: the record is undone
            return "stopped"
        if action.kind == "evict":
            result = await self._evict(pod)
        elif action.kind == MIGRATE_MEMORY:
            result = await self._move_memory(pod)
        else:
            result = await self._resize(
                pod, action.finding.profile, action.finding.recommended, intent
            )
        kind = "Normal" if result == DONE[action.kind] else "Warning"
        reason = f"Remediation{result.title().replace('_', '')}"
        f = action.finding
        said = f"{action.detail} (finding: {f.kind} {f.reason})"  # as a refusal names it
        await self.event(pod, reason, said, kind)
        await self.event(pod, reason, f"{pod.namespace}/{pod.name}: {said}", kind, owner=True)
        return result

    async def record(self, workload: str, history: WorkloadHistory) -> str:
        """Write the workload's history on it: ok | not_leader | gone | failed."""
        if not self.leading():
            return "not_leader"
        kind, namespace, name = workload.split("/")
        answer = await self.writer.patch(
            f"/apis/apps/v1/namespaces/{namespace}/{HISTORY_OWNERS[kind]}/{name}",
            {"metadata": _history_metadata(history)},
        )
        if answer.ok:
            return "ok"
        log.warning("history of %s not written: HTTP %s", workload, answer.status)
        return "gone" if answer.status == 404 else "failed"

    async def delete_rejected(self, pod: RejectedPod) -> str:
        """Delete a pod the kubelet refused (it runs nothing): deleted | gone | failed |
        not_leader. Only that pod: one made since under its name is not touched."""
        if not self.leading():
            return "not_leader"
        answer = await self.writer.delete(
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
            {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": pod.uid}},
        )
        if answer.ok:
            return "deleted"
        if answer.status in (404, 409):
            return "gone"
        log.warning("deletion of %s/%s: HTTP %s", pod.namespace, pod.name, answer.status)
        return "failed"

    async def steer(
        self,
        target: Target,
        now: float,
        add: tuple[Steer, ...] = (),
        pending: frozenset[str] | None = None,
        last: bool = False,
    ) -> str:
        """Bring the steering webhook configuration up to date (core/steering.py
        ``configured``): ok | not_leader | failed. Asked again once if another write came
        between its read and its own (409). ``last``: the leader's last write, as it stops,
        while it still leads."""
        path = f"{_WEBHOOKS}/{target.configuration}"
        for _ in range(2):
            if not self.leading() or (self.stopping() and not last):
                return "not_leader"
            got = await self.kube.get(path)
            if not got.ok:
                log.warning("webhook configuration %s: HTTP %s", path, got.status)
                return "failed"
            changed = configured(got.body, target, now, add, pending)
            if changed is None:
                return "ok"
            answer = await self.writer.put(path, changed)
            if answer.ok:
                return "ok"
            if answer.status != 409:
                log.warning("webhook configuration not written: HTTP %s", answer.status)
                return "failed"
        return "failed"

    async def fill_secret(self, secret: dict, data: dict[str, str]) -> str:
        """Write the steering webhook's certificate into its Secret, which the install
        made empty: ok | conflict (another replica filled it first) | not_leader | failed."""
        if not self.leading():
            return "not_leader"
        meta = secret["metadata"]
        answer = await self.writer.put(
            f"/api/v1/namespaces/{meta['namespace']}/secrets/{meta['name']}",
            {**secret, "data": data},
        )
        if answer.ok:
            return "ok"
        return "conflict" if answer.status == 409 else "failed"

    async def refused(self, refusal: Refusal, pod: PodInfo | None) -> None:
        if pod is not None:
            f = refusal.finding  # a pod may have several: the Event says which it is about
            said = f"{refusal.guard}: {refusal.detail} (finding: {f.kind} {f.reason})"
            await self.event(pod, "RemediationRefused", said, "Normal")

    async def _evict(self, pod: PodInfo) -> str:
        answer = await self.writer.post(
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/eviction",
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": pod.name, "namespace": pod.namespace},
                # only this pod: if it was replaced by another of the same name, no-op
                "deleteOptions": {"preconditions": {"uid": pod.uid}},
            },
        )
        if answer.ok:
            return "evicted"
        if answer.status == 429:
            return "pdb_blocked"
        if answer.status in (404, 409):  # 409: the name is another pod's now (uid precondition)
            return "gone"
        log.warning("eviction of %s/%s: HTTP %s", pod.namespace, pod.name, answer.status)
        return "failed"

    async def _move_memory(self, pod: PodInfo) -> str:
        """Ask the pod's node to move its memory home in place: the request annotation
        on the pod, a new value each time (the exporter carries out each value once);
        only on this pod (its uid, a precondition of the patch)."""
        answer = await self.writer.patch(
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
            {
                "metadata": {
                    "uid": pod.uid,
                    "annotations": {REQUEST_ANNOTATION: f"{self.clock():.0f}"},
                }
            },
        )
        if answer.ok:
            return "requested"
        if answer.status == 404 or _uid_differs(answer):  # the name is another pod's now
            return "gone"
        log.warning("memory move of %s/%s: HTTP %s", pod.namespace, pod.name, answer.status)
        return "failed"

    async def _resize(
        self, pod: PodInfo, old: str, new: str, intent: WorkloadHistory | None
    ) -> str:
        """Swap the owner's pod template from slices of ``old`` to ``new``, with the
        history recording it in the same write: nvidia.com/mig-<old> for
        nvidia.com/mig-<new> in its containers, or, where its pods get the slice from a
        ResourceClaimTemplate, a new template asking for ``new`` in place of the old."""
        kind, namespace, name = pod.workload.split("/")
        path = f"/apis/apps/v1/namespaces/{namespace}/{HISTORY_OWNERS[kind]}/{name}"
        answer = await self.kube.get(path)
        if not answer.ok:
            return "gone" if answer.status == 404 else "failed"
        workload = answer.body
        spec = workload["spec"]["template"]["spec"]
        containers = spec["containers"]
        before, after = mig_resource(old), mig_resource(new)
        changed = False
        for c in containers:
            for part in ("requests", "limits"):
                values = c.setdefault("resources", {}).get(part) or {}
                if before in values:
                    values[after] = values.pop(before)
                    c["resources"][part] = values
                    changed = True
        template = {"containers": containers}
        if not changed:
            claims = await self._claim_template_swapped(workload, old, new)
            if claims is None:
                return "failed"  # the template no longer asks for that profile
            template = {"resourceClaims": claims}
        meta = {"resourceVersion": workload["metadata"]["resourceVersion"]}
        if intent is not None:
            meta.update(_history_metadata(intent))
        patch = {"metadata": meta, "spec": {"template": {"spec": template}}}
        patched = await self.writer.patch(path, patch)
        return "resized" if patched.ok else "failed"

    async def _claim_template_swapped(self, workload: dict, old: str, new: str) -> list | None:
        """The workload's pod template's resourceClaims with the one from a template
        selecting ``old`` pointed at a new template selecting ``new`` — made here (a
        template's spec is immutable), owned by the workload; None when none selects
        ``old`` or the new template cannot be made."""
        meta = workload["metadata"]
        namespace = meta["namespace"]
        claims = workload["spec"]["template"]["spec"].get("resourceClaims") or []
        templates = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates"
        for entry in claims:
            was = entry.get("resourceClaimTemplateName")
            if not was:
                continue
            answer = await self.kube.get(f"{templates}/{was}")
            spec = (answer.body.get("spec") or {}) if answer.ok else {}
            if claim_profile(spec.get("spec") or {}) != old:
                continue
            made = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {
                    "name": template_name(meta["name"], new),
                    "namespace": namespace,
                    "labels": {RESIZED_LABEL: "true"},
                    "annotations": {REPLACES_ANNOTATION: was},
                    "ownerReferences": [
                        {
                            "apiVersion": workload.get("apiVersion", "apps/v1"),
                            "kind": workload.get("kind", "Deployment"),
                            "name": meta["name"],
                            "uid": meta["uid"],
                        }
                    ],
                },
                "spec": {**spec, "spec": with_profile(spec["spec"], old, new)},
            }
            created = await self.writer.post(templates, made)
            if created.status == 409:  # an earlier try made it: used only if it is this
                existing = await self.kube.get(f"{templates}/{made['metadata']['name']}")
                if not existing.ok or existing.body.get("spec") != made["spec"]:
                    return None
            elif not created.ok:
                log.warning("creating ResourceClaimTemplate: HTTP %s", created.status)
                return None
            entry["resourceClaimTemplateName"] = made["metadata"]["name"]
            return claims
        return None

    async def collect_templates(self) -> list[str]:
        """Delete the templates resizes replaced once nothing uses them: no pod, and no
        workload that makes pods (a ReplicaSet scaled to 0 keeps its template only for a
        rollback). Returns the namespace/names deleted."""
        listed = await self.kube.get(
            f"{RESOURCE_API}/resourceclaimtemplates", labelSelector=f"{RESIZED_LABEL}=true"
        )
        if not listed.ok:
            return []
        deleted = []
        for made in listed.body.get("items") or ():
            namespace = made["metadata"]["namespace"]
            was = (made["metadata"].get("annotations") or {}).get(REPLACES_ANNOTATION)
            if not was or await self._template_in_use(namespace, was):
                continue
            path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates/{was}"
            answer = await self.writer.delete(path, {})
            if answer.ok:
                deleted.append(f"{namespace}/{was}")
                log.info(
                    "deleted ResourceClaimTemplate %s/%s: a resize replaced it, nothing uses it",
                    namespace,
                    was,
                    extra={"decision": "template_deleted", "namespace": namespace, "name": was},
                )
        return deleted

    async def _template_in_use(self, namespace: str, name: str) -> bool:
        """Whether a pod, or a workload that makes pods, of ``namespace`` uses template
        ``name``; True when that cannot be read (nothing is deleted on doubt)."""

        def uses(pod_spec: dict | None) -> bool:
            claims = (pod_spec or {}).get("resourceClaims") or ()
            return any(c.get("resourceClaimTemplateName") == name for c in claims)

        pods = await self.kube.get(f"/api/v1/namespaces/{namespace}/pods")
        if not pods.ok or any(uses(p.get("spec")) for p in pods.body.get("items") or ()):
            return True
        for group, kind in _POD_MAKERS:
            listed = await self.kube.get(f"/apis/{group}/namespaces/{namespace}/{kind}")
            if not listed.ok:
                return True
            for w in listed.body.get("items") or ():
                spec = w.get("spec") or {}
                making = kind != "replicasets" or (spec.get("replicas") or 0) > 0
                making = making or ((w.get("status") or {}).get("replicas") or 0) > 0
                template = (spec.get("jobTemplate") or {}).get("spec") or spec  # a CronJob's
                if making and uses((template.get("template") or {}).get("spec")):
                    return True
        return False

    async def relayout(self, step: Step, version: str) -> str:
        """One step of a node's MIG re-layout, in one patch guarded by the node's
        ``version`` (resourceVersion: a node changed since it was read is left to the
        next cycle): done | dry_run | conflict | failed | not_leader | stopped."""
        if not self.leading():
            return "not_leader"
        if self.stopping():
            return "stopped"
        annotation = step.relayout.encode() if step.relayout is not None else None
        meta: dict = {"resourceVersion": version, "annotations": {RELAYOUT_ANNOTATION: annotation}}
        if step.labels:
            meta["labels"] = step.labels
        patch: dict = {"metadata": meta}
        if step.unschedulable is not None:
            patch["spec"] = {"unschedulable": step.unschedulable or None}
        if not self.writer.acting:
            result = "dry_run"
        else:
            answer = await self.writer.patch(f"/api/v1/nodes/{step.node}", patch)
            result = "done" if answer.ok else "conflict" if answer.status == 409 else "failed"
        if result in ("done", "dry_run"):
            would, did = _PHASE_VERBS[step.phase]
            verb = f"would {would}" if result == "dry_run" else did
            text = f"MIG re-layout: {verb}: {step.why}"
            kind = "Warning" if step.phase in ("failed", "wedged") else "Normal"
            involved = {"apiVersion": "v1", "kind": "Node", "name": step.node}
            await self._post_event("default", step.node, involved, "MigRelayout", text, kind)
        return result

    async def event(
        self, pod: PodInfo | None, reason: str, message: str, kind: str, owner: bool = False
    ) -> None:
        """An Event on the pod, or (``owner``) on the workload that owns it."""
        if pod is None or (owner and not pod.workload) or not self.leading() or self.stopping():
            return
        if owner:
            workload_kind, _, name = pod.workload.split("/")
            involved = {
                "apiVersion": "apps/v1",
                "kind": workload_kind,
                "name": name,
                "namespace": pod.namespace,
            }
        else:
            involved = {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
            }
        await self._post_event(pod.namespace, pod.name, involved, reason, message, kind)

    async def _post_event(
        self, namespace: str, name: str, involved: dict, reason: str, message: str, kind: str
    ) -> None:
        now = datetime.fromtimestamp(self.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        answer = await self.writer.post(
            f"/api/v1/namespaces/{namespace}/events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{name}.", "namespace": namespace},
                "involvedObject": involved,
                "reason": reason,
                "message": message[:1024],
                "type": kind,
                "source": {"component": COMPONENT},
                "reportingComponent": COMPONENT,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
        )
        if not answer.ok:  # an Event lost is not worth failing the cycle for
            log.info("event %s on %s/%s: HTTP %s", reason, namespace, name, answer.status)


# a re-layout's step, as its Event says it: (in a dry run, done)
_PHASE_VERBS = {
    "cordoned": ("cordon", "cordoned"),
    "relabelled": ("relabel", "relabelled"),
    "done": ("uncordon", "uncordoned"),
    "abandoned": ("uncordon, nothing changed", "uncordoned, nothing changed"),
    "failed": ("leave cordoned", "failed"),
    "wedged": ("leave cordoned", "wedged"),
}


def _uid_differs(answer: Answer) -> bool:
    """A patch whose metadata.uid is not the object's: the API server answers 422, the
    field immutable (not 409, as for an eviction's precondition)."""
    details = answer.body.get("details") if isinstance(answer.body, dict) else None
    causes = (details or {}).get("causes") or []
    return answer.status == 422 and any(c.get("field") == "metadata.uid" for c in causes)


def _history_metadata(history: WorkloadHistory) -> dict:
    """The annotation holding the history, and the label that finds workloads with
    actions awaiting verification (removed when none is)."""
    return {
        "annotations": {HISTORY_ANNOTATION: history.to_json()},
        "labels": {PENDING_LABEL: "true" if history.pending else None},
    }
