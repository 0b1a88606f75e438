"""The `k8s` launcher's manifests: a gate's node-side programs as one Indexed Job, rendered, never applied here.

Pure functions from the inventory's ``k8s:`` block (harness.config.models.K8sConfig) and a gate's per-node
commands to Kubernetes objects (plain dicts, as ``kubectl apply -f`` reads them): a ConfigMap holding the
node program (``harness/node/k8s_task.py`` and the gate's own program), its spec and the suite's config, and
an Indexed Job (``completionMode: Indexed``, one pod per reader node; the completion index is the rank) whose
pods each run ``k8s_task.py``. The start barrier, the output files and their names are the slurm launcher's
(harness/execute/slurm.py): see k8s_task.py. Results go to a shared ReadWriteMany volume that ``kvgate
collect`` reads back (harness/suite/k8s.py). kvgate does not talk to a cluster: no command is sent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

CONFIG_MOUNT = "/kvgate"
RESULTS_MOUNT = "/results"
TASK_PROGRAM = "k8s_task.py"


@dataclass(frozen=True)
class K8sCluster:
    """The cluster as the inventory names it (``k8s:``; harness.config.models.K8sConfig)."""

    image: str
    results_claim: str
    namespace: str = "default"
    python: str = "python3"
    pool_claim: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    gpu_resource: str = "nvidia.com/gpu"
    gpus_per_pod: int = 0
    privileged: bool = False
    go_lead_s: float = 2.0
    time_margin_s: float = 60.0

    @classmethod
    def from_config(cls, cfg: Any) -> "K8sCluster":
        return cls(image=cfg.image, results_claim=cfg.results_claim, namespace=cfg.namespace, python=cfg.python,
                   pool_claim=cfg.pool_claim, node_selector=dict(cfg.node_selector), gpu_resource=cfg.gpu_resource,
                   gpus_per_pod=cfg.gpus_per_pod, privileged=cfg.privileged, go_lead_s=cfg.go_lead_s,
                   time_margin_s=cfg.time_margin_s)


def k8s_name(*parts: str) -> str:
    """Pure: a DNS-1123 name from ``parts`` (lower case, ``-`` for anything else, at most 63 characters)."""
    s = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    return s[:63].rstrip("-") or "kvgate"


def config_map(name: str, namespace: str, data: Mapping[str, str], labels: Mapping[str, str]) -> dict:
    """Pure: the ConfigMap holding the node program, its spec and the suite's config (file name -> text)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "data": dict(data)}


def indexed_job(cluster: K8sCluster, name: str, config_map_name: str, nodes: Sequence[str], pool_path: str,
                results_dir: str, deadline_s: float, labels: Mapping[str, str]) -> dict:
    """Pure: the Indexed Job of one gate: one pod on each of ``nodes`` (required node affinity to exactly those
    nodes, at most one of the Job's pods per node), every pod running ``k8s_task.py`` over the ConfigMap, with
    the shared results volume, the pool at ``pool_path`` (the cluster's ``pool_claim`` or each node's own
    directory as a hostPath), ``results_dir`` (under the results volume's mount) for the files, the GPU
    request and node selector, and ``activeDeadlineSeconds`` = ``deadline_s``.
    No retries (``backoffLimit: 0``): a rank run again would start outside the common barrier."""
    n = len(nodes)
    pod_labels = {**labels, "kvgate/job": name}
    resources: dict[str, Any] = {}
    if cluster.gpus_per_pod:
        resources = {"limits": {cluster.gpu_resource: str(cluster.gpus_per_pod)},
                     "requests": {cluster.gpu_resource: str(cluster.gpus_per_pod)}}
    pool_volume: dict[str, Any] = (
        {"name": "pool", "persistentVolumeClaim": {"claimName": cluster.pool_claim}} if cluster.pool_claim
        else {"name": "pool", "hostPath": {"path": pool_path, "type": "Directory"}})
    container = {
        "name": "kvgate-task",
        "image": cluster.image,
        "command": [cluster.python, f"{CONFIG_MOUNT}/{TASK_PROGRAM}", "--config-dir", CONFIG_MOUNT,
                    "--results", results_dir],
        "env": [{"name": "KVGATE_K8S_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "KVGATE_K8S_JOB", "value": name}],
        "volumeMounts": [{"name": "kvgate-config", "mountPath": CONFIG_MOUNT, "readOnly": True},
                         {"name": "results", "mountPath": RESULTS_MOUNT},
                         {"name": "pool", "mountPath": pool_path}],
        "securityContext": {"privileged": bool(cluster.privileged)},
    }
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [{"name": "kvgate-config", "configMap": {"name": config_map_name}},
                    {"name": "results", "persistentVolumeClaim": {"claimName": cluster.results_claim}},
                    pool_volume],
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": list(nodes)}]}]}},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"kvgate/job": name}}, "topologyKey": "kubernetes.io/hostname"}]},
        },
    }
    if cluster.node_selector:
        pod_spec["nodeSelector"] = dict(cluster.node_selector)
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": cluster.namespace, "labels": dict(labels)},
            "spec": {"completionMode": "Indexed", "completions": n, "parallelism": n, "backoffLimit": 0,
                     "activeDeadlineSeconds": max(1, int(deadline_s + 0.999)),
                     "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec}}}
