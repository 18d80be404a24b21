"""Kubernetes placement for the pipeline's steps, in dagster-k8s's own tag format.

Dagster-free (plain dicts and JSON), cheap to import. What it returns is consumed by
``dagster-k8s``: the ``dagster-k8s/config`` op tag (read by ``k8s_job_executor`` for every step
pod it creates) and the executor's run config. ``tests/deploy/test_k8s_config.py`` checks both
against dagster-k8s's own parsers and job builder.

Usage in the definitions (the op tags travel with the asset, so UI launches, backfills and
schedules all honour them)::

    @dg.asset(key="mask", pool="gpu", op_tags=k8s.gpu_op_tags(), ...)
    @dg.asset(key="features", op_tags=k8s.cpu_op_tags(), ...)

    # only on the cluster (k8s_job_executor refuses to run without a K8sRunLauncher):
    if k8s.use_k8s_executor():        # DATAMASK_EXECUTOR=k8s, set by deploy/
        from dagster_k8s import k8s_job_executor
        executor = k8s_job_executor.configured(k8s.k8s_executor_config())

Placement rules
---------------
* GPU step (mask learning): requests and limits ``nvidia.com/gpu: <count>`` (extended resources
  must appear in ``limits``; requests are set equal), CPU and memory requests, a memory limit
  equal to the request, a node selector for GPU nodes and a toleration for the usual GPU taint.
  Its tag uses ``merge_behavior: SHALLOW`` and sets ``node_selector``, ``tolerations`` and
  ``affinity`` explicitly, so CPU placement inherited from the run launcher or the executor's
  ``step_k8s_config`` is *replaced*, not deep-merged into an unschedulable mix.
* CPU steps (everything else): CPU and memory requests, a memory limit, an optional node
  selector and, by default, a required node affinity that keeps them *off* the GPU nodes
  (``NotIn`` on each GPU node-selector label), so they never occupy a GPU machine even when
  the GPU nodes are not tainted. No GPU resource.
* The executor config makes the CPU placement the default of every step
  (``step_k8s_config``); the GPU tag overrides it for the mask step.

Environment variables (read when the function is called, i.e. when the definitions load in
the code server and in every run/step pod; all optional):

=====================================  ========================================================
``DATAMASK_K8S_GPU_COUNT``             GPUs per mask step (default ``1``)
``DATAMASK_K8S_GPU_RESOURCE``          extended resource name (default ``nvidia.com/gpu``)
``DATAMASK_K8S_GPU_CPU``               CPU request of the GPU step (default ``4``)
``DATAMASK_K8S_GPU_MEMORY``            memory request = limit of the GPU step (default ``32Gi``;
                                       see deploy/SIZING.md)
``DATAMASK_K8S_GPU_NODE_SELECTOR``     ``key=value[,key=value]`` (default
                                       ``nvidia.com/gpu.present=true``, the label NVIDIA's GPU
                                       feature discovery puts on GPU nodes); ``none`` for none
``DATAMASK_K8S_GPU_TOLERATIONS``       ``key[=value][:effect][,...]`` (default
                                       ``nvidia.com/gpu:NoSchedule``: tolerate that taint with
                                       any value); ``none`` for none
``DATAMASK_K8S_CPU_CPU``               CPU request of CPU steps (default ``2``)
``DATAMASK_K8S_CPU_MEMORY``            memory request = limit of CPU steps (default ``8Gi``)
``DATAMASK_K8S_CPU_NODE_SELECTOR``     node selector of CPU steps (default: none)
``DATAMASK_K8S_CPU_TOLERATIONS``       tolerations of CPU steps (default: none)
``DATAMASK_K8S_CPU_AVOID_GPU_NODES``   ``1`` (default) / ``0``: keep CPU steps off the nodes the
                                       GPU node selector matches
``DATAMASK_K8S_OBJECT_STORE_SECRET``   Kubernetes Secret whose keys become the step pods'
                                       environment (default ``datamask-object-store``; holds
                                       AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
                                       AWS_ENDPOINT_URL, DATAMASK_DATA_ROOT); ``none`` for none
``DATAMASK_K8S_NAMESPACE``             namespace of the step pods (default: the run launcher's)
``DATAMASK_EXECUTOR``                  ``k8s``: :func:`use_k8s_executor` is true (unset: false)
=====================================  ========================================================

An invalid value raises ``ValueError`` naming the variable.
"""

from __future__ import annotations

import json
import os
import re
from typing import Mapping, Optional

__all__ = [
    "K8S_CONFIG_TAG",
    "GPU_POOL",
    "gpu_k8s_config",
    "cpu_k8s_config",
    "gpu_op_tags",
    "cpu_op_tags",
    "k8s_executor_config",
    "use_k8s_executor",
    "parse_node_selector",
    "parse_tolerations",
]

K8S_CONFIG_TAG = "dagster-k8s/config"  # dagster_k8s.job.USER_DEFINED_K8S_CONFIG_KEY
GPU_POOL = "gpu"  # the mask asset's concurrency pool; its limit = number of GPUs

ENV_GPU_COUNT = "DATAMASK_K8S_GPU_COUNT"
ENV_GPU_RESOURCE = "DATAMASK_K8S_GPU_RESOURCE"
ENV_GPU_CPU = "DATAMASK_K8S_GPU_CPU"
ENV_GPU_MEMORY = "DATAMASK_K8S_GPU_MEMORY"
ENV_GPU_NODE_SELECTOR = "DATAMASK_K8S_GPU_NODE_SELECTOR"
ENV_GPU_TOLERATIONS = "DATAMASK_K8S_GPU_TOLERATIONS"
ENV_CPU_CPU = "DATAMASK_K8S_CPU_CPU"
ENV_CPU_MEMORY = "DATAMASK_K8S_CPU_MEMORY"
ENV_CPU_NODE_SELECTOR = "DATAMASK_K8S_CPU_NODE_SELECTOR"
ENV_CPU_TOLERATIONS = "DATAMASK_K8S_CPU_TOLERATIONS"
ENV_CPU_AVOID_GPU = "DATAMASK_K8S_CPU_AVOID_GPU_NODES"
ENV_SECRET = "DATAMASK_K8S_OBJECT_STORE_SECRET"
ENV_NAMESPACE = "DATAMASK_K8S_NAMESPACE"

DEFAULTS = {
    ENV_GPU_COUNT: "1",
    ENV_GPU_RESOURCE: "nvidia.com/gpu",
    ENV_GPU_CPU: "4",
    ENV_GPU_MEMORY: "32Gi",
    ENV_GPU_NODE_SELECTOR: "nvidia.com/gpu.present=true",
    ENV_GPU_TOLERATIONS: "nvidia.com/gpu:NoSchedule",
    ENV_CPU_CPU: "2",
    ENV_CPU_MEMORY: "8Gi",
    ENV_CPU_NODE_SELECTOR: "",
    ENV_CPU_TOLERATIONS: "",
    ENV_CPU_AVOID_GPU: "1",
    ENV_SECRET: "datamask-object-store",
    ENV_NAMESPACE: "",
}

# Kubernetes resource quantity (decimal or binary SI suffix, or millicores).
_QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
# Label key: optional DNS-subdomain prefix and '/', then a name of <= 63 characters.
_LABEL_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.\-]{0,61}[A-Za-z0-9])?"
_LABEL_KEY_RE = re.compile(rf"^([a-z0-9]([a-z0-9.\-]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE_RE = re.compile(rf"^({_LABEL_NAME})?$")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?$")
_NONE = ("none", "-")


def _get(env: Optional[Mapping[str, str]], name: str) -> str:
    src = os.environ if env is None else env
    value = src.get(name)
    if value is None:
        return DEFAULTS[name]
    return value.strip()


def _quantity(env, name: str) -> str:
    value = _get(env, name)
    if not _QUANTITY_RE.match(value) or float(re.sub(r"[^0-9.]", "", value)) <= 0:
        raise ValueError(
            f"{name}={value!r} is not a positive Kubernetes quantity (examples: 4, 500m, 32Gi)"
        )
    return value


def _positive_int(env, name: str) -> int:
    value = _get(env, name)
    if not re.fullmatch(r"[0-9]+", value) or int(value) < 1:
        raise ValueError(f"{name}={value!r} must be a whole number >= 1")
    return int(value)


def _flag(env, name: str) -> bool:
    value = _get(env, name).lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{name}={value!r} must be 1/0 (or true/false)")


def _check_label_key(key: str, what: str) -> str:
    if not _LABEL_KEY_RE.match(key):
        raise ValueError(f"{what}: {key!r} is not a valid Kubernetes label key")
    return key


def parse_node_selector(text: str, what: str = "node selector") -> dict:
    """``"a=b,c=d"`` -> ``{"a": "b", "c": "d"}``; ``""`` / ``"none"`` -> ``{}``."""
    text = (text or "").strip()
    if text.lower() in _NONE or not text:
        return {}
    out = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f"{what}: {item!r} must be key=value")
        key, value = (s.strip() for s in item.split("=", 1))
        _check_label_key(key, what)
        if not _LABEL_VALUE_RE.match(value):
            raise ValueError(f"{what}: {value!r} is not a valid Kubernetes label value")
        if key in out and out[key] != value:
            raise ValueError(f"{what}: {key!r} given twice with different values")
        out[key] = value
    return out


def parse_tolerations(text: str, what: str = "tolerations") -> list:
    """``"key[=value][:effect],..."`` -> Kubernetes tolerations (snake_case, as dagster-k8s
    takes them). Without ``=value`` the operator is ``Exists`` (any value); without
    ``:effect`` every effect is tolerated."""
    text = (text or "").strip()
    if text.lower() in _NONE or not text:
        return []
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        spec, _, effect = item.partition(":")
        effect = effect.strip()
        if effect and effect not in _EFFECTS:
            raise ValueError(f"{what}: effect {effect!r} must be one of {', '.join(_EFFECTS)}")
        key, eq, value = (s.strip() for s in spec.partition("="))
        _check_label_key(key, what)
        tol = {"key": key, "operator": "Equal" if eq else "Exists"}
        if eq:
            if not _LABEL_VALUE_RE.match(value):
                raise ValueError(f"{what}: {value!r} is not a valid taint value")
            tol["value"] = value
        if effect:
            tol["effect"] = effect
        out.append(tol)
    return out


def _resources(cpu: str, memory: str, gpu: Optional[tuple] = None) -> dict:
    requests = {"cpu": cpu, "memory": memory}
    # Memory limit = request: a step that outgrows its estimate is OOM-killed at a known size
    # instead of being evicted under node pressure. No CPU limit (throttling only slows).
    limits = {"memory": memory}
    if gpu is not None:
        name, count = gpu
        requests[name] = str(count)
        limits[name] = str(count)
    return {"requests": requests, "limits": limits}


def gpu_k8s_config(env: Optional[Mapping[str, str]] = None) -> dict:
    """The user-defined k8s config (dagster-k8s schema, snake_case) of the GPU step."""
    resource = _get(env, ENV_GPU_RESOURCE)
    _check_label_key(resource, ENV_GPU_RESOURCE)
    count = _positive_int(env, ENV_GPU_COUNT)
    return {
        "container_config": {
            "resources": _resources(
                _quantity(env, ENV_GPU_CPU), _quantity(env, ENV_GPU_MEMORY), (resource, count)
            ),
        },
        "pod_spec_config": {
            "node_selector": parse_node_selector(
                _get(env, ENV_GPU_NODE_SELECTOR), ENV_GPU_NODE_SELECTOR
            ),
            "tolerations": parse_tolerations(_get(env, ENV_GPU_TOLERATIONS), ENV_GPU_TOLERATIONS),
            # Replaces any CPU-only affinity inherited from the launcher / executor defaults.
            "affinity": {},
        },
        "merge_behavior": "SHALLOW",
    }


def cpu_k8s_config(env: Optional[Mapping[str, str]] = None) -> dict:
    """The user-defined k8s config (dagster-k8s schema, snake_case) of a CPU step."""
    pod_spec: dict = {}
    selector = parse_node_selector(_get(env, ENV_CPU_NODE_SELECTOR), ENV_CPU_NODE_SELECTOR)
    if selector:
        pod_spec["node_selector"] = selector
    tolerations = parse_tolerations(_get(env, ENV_CPU_TOLERATIONS), ENV_CPU_TOLERATIONS)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    gpu_selector = parse_node_selector(_get(env, ENV_GPU_NODE_SELECTOR), ENV_GPU_NODE_SELECTOR)
    if _flag(env, ENV_CPU_AVOID_GPU) and gpu_selector:
        pod_spec["affinity"] = {
            "node_affinity": {
                "required_during_scheduling_ignored_during_execution": {
                    "node_selector_terms": [
                        {
                            "match_expressions": [
                                # NotIn also matches nodes that lack the label entirely.
                                {"key": k, "operator": "NotIn", "values": [v]}
                                for k, v in sorted(gpu_selector.items())
                            ]
                        }
                    ]
                }
            }
        }
    return {
        "container_config": {
            "resources": _resources(_quantity(env, ENV_CPU_CPU), _quantity(env, ENV_CPU_MEMORY)),
        },
        "pod_spec_config": pod_spec,
    }


def _tag(config: dict) -> dict:
    # A JSON string, the form dagster-k8s's get_user_defined_k8s_config parses (json.loads).
    return {K8S_CONFIG_TAG: json.dumps(config, sort_keys=True)}


def gpu_op_tags(env: Optional[Mapping[str, str]] = None) -> dict:
    """Op tags for the mask-learning asset: ``@dg.asset(op_tags=gpu_op_tags(), pool="gpu")``."""
    return _tag(gpu_k8s_config(env))


def cpu_op_tags(env: Optional[Mapping[str, str]] = None) -> dict:
    """Op tags for CPU assets (ingestion, selection, reports)."""
    return _tag(cpu_k8s_config(env))


def k8s_executor_config(env: Optional[Mapping[str, str]] = None) -> dict:
    """Config of ``dagster_k8s.k8s_job_executor`` (``execution: config:`` in run config, or
    ``k8s_job_executor.configured(...)``): CPU placement as every step's default, the
    object-store secret as environment of every step pod. The job image, service account and
    instance ConfigMap come from the K8sRunLauncher and the code location (Helm
    ``includeConfigInLaunchedRuns``), so they are not repeated here."""
    cfg: dict = {"step_k8s_config": cpu_k8s_config(env)}
    secret = _get(env, ENV_SECRET)
    if secret and secret.lower() not in _NONE:
        if not _DNS_LABEL_RE.match(secret) and not re.fullmatch(r"[a-z0-9.\-]{1,253}", secret):
            raise ValueError(f"{ENV_SECRET}={secret!r} is not a valid Kubernetes Secret name")
        cfg["env_secrets"] = [secret]
    namespace = _get(env, ENV_NAMESPACE)
    if namespace:
        if not _DNS_LABEL_RE.match(namespace):
            raise ValueError(f"{ENV_NAMESPACE}={namespace!r} is not a valid namespace name")
        cfg["job_namespace"] = namespace
    return cfg


ENV_EXECUTOR = "DATAMASK_EXECUTOR"


def use_k8s_executor(env: Optional[Mapping[str, str]] = None) -> bool:
    """True when ``DATAMASK_EXECUTOR=k8s``: the definitions should then run every job with
    ``k8s_job_executor.configured(k8s_executor_config())``. The deployment sets it on the code
    location and the run launcher (deploy/helm/values.yaml, deploy/dagster.yaml); anywhere
    else (laptop, CI) it is unset and Dagster's default executor stays."""
    src = os.environ if env is None else env
    value = (src.get(ENV_EXECUTOR) or "").strip().lower()
    if value in ("", "default", "multiprocess", "in_process"):
        return False
    if value == "k8s":
        return True
    raise ValueError(f"{ENV_EXECUTOR}={value!r}: use 'k8s' or leave it unset")
