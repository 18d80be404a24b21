"""deploy/kuberay/raycluster.yaml and its wiring into the Helm values (deploy/helm/values-ray.yaml).

No cluster, no KubeRay operator, no helm here. What is checked, and with what:

* The RayCluster: apiVersion/kind; every field of its spec is one KubeRay's ray.io/v1 Go types
  define (key sets read from ray-operator/apis/ray/v1/raycluster_types.go, KubeRay v1.7.0, for
  this work); rayStartParams values are strings (the CRD's map[string]string); each pod
  template deserialises into the Kubernetes client's own V1PodTemplateSpec and serialises back
  unchanged (a misspelt or misplaced field is dropped by the models, so the round trip fails).
* The content: the image is the Helm chart's code-location image; rayVersion is the Dockerfile's
  RAY_VERSION, inside the pyproject's ray extra and the installed Ray's major.minor; every
  container (and the autoscaler sidecar) has CPU and memory requests and limits; workers' memory
  request = limit, num-cpus = the CPU limit, the object store fits inside the memory limit;
  the head schedules no tasks and exposes the Ray Client port 10001; the Secret is the chart's.
* The Helm wiring: values.yaml and values-ray.yaml merged the way `helm -f a -f b` merges them
  (maps merged key by key, lists and scalars replaced); the result passes the same structural
  check as values.yaml (tests/deploy/test_k8s_config.py), equals values.yaml plus
  DATAMASK_RAY_ADDRESS, and the address is ray://<RayCluster name>-head-svc:10001. Without the
  overlay the variable is absent everywhere. With it, the step pods that dagster-k8s's own step
  handler builds carry the variable.
* Optional, when DATAMASK_KUBERAY_CRD names KubeRay's CRD file
  (ray-operator/config/crd/bases/ray.io_rayclusters.yaml): the manifest validated against the
  CRD's openAPIV3Schema with jsonschema, unknown fields rejected as the API server's strict
  field validation does.
"""

from __future__ import annotations

import copy
import json
import os
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from datamask_pipeline import k8s, settings
from tests.deploy import test_k8s_config as k8s_tests

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
MANIFEST = DEPLOY / "kuberay" / "raycluster.yaml"
CLIENT_PORT = 10001
VAR = settings.ENV_RAY_ADDRESS

# KubeRay v1.7.0, ray-operator/apis/ray/v1/raycluster_types.go: json names of the fields.
RAYCLUSTER_SPEC_KEYS = {
    "upgradeStrategy", "authOptions", "suspend", "managedBy", "autoscalerOptions",
    "headServiceAnnotations", "enableInTreeAutoscaling", "gcsFaultToleranceOptions",
    "historyServerOptions", "networkPolicy", "tlsOptions", "headGroupSpec", "rayVersion",
    "workerGroupSpecs"}
HEAD_GROUP_KEYS = {"template", "headService", "enableIngress", "ingressOptions", "resources",
                   "labels", "rayStartParams", "serviceType"}
HEAD_GROUP_REQUIRED = {"template", "rayStartParams"}
WORKER_GROUP_KEYS = {"suspend", "groupName", "replicas", "minReplicas", "maxReplicas",
                     "idleTimeoutSeconds", "priority", "resources", "labels", "rayStartParams",
                     "template", "scaleStrategy", "numOfHosts"}
WORKER_GROUP_REQUIRED = {"groupName", "minReplicas", "maxReplicas", "rayStartParams", "template"}
AUTOSCALER_KEYS = {"resources", "image", "imagePullPolicy", "securityContext",
                   "idleTimeoutSeconds", "upscalingMode", "version", "env", "envFrom",
                   "volumeMounts", "command"}


def _yaml(path: Path):
    with open(path) as fh:
        return yaml.safe_load(fh)


@pytest.fixture(scope="module")
def cluster() -> dict:
    return _yaml(MANIFEST)


@pytest.fixture(scope="module")
def helm_values() -> dict:
    return _yaml(DEPLOY / "helm" / "values.yaml")


@pytest.fixture(scope="module")
def ray_overlay() -> dict:
    return _yaml(DEPLOY / "helm" / "values-ray.yaml")


def _containers(cluster: dict) -> list[tuple[str, dict]]:
    spec = cluster["spec"]
    out = [("head", c) for c in spec["headGroupSpec"]["template"]["spec"]["containers"]]
    for group in spec["workerGroupSpecs"]:
        out += [(group["groupName"], c) for c in group["template"]["spec"]["containers"]]
    return out


def _quantity(value) -> float:
    """A Kubernetes quantity as a number (bytes for memory, cores for CPU)."""
    s = str(value)
    m = re.fullmatch(r"([0-9.]+)(m|Ki|Mi|Gi|Ti|k|M|G|T)?", s)
    assert m, f"not a quantity: {s!r}"
    scale = {None: 1, "m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
             "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[m.group(2)]
    return float(m.group(1)) * scale


def _chart_image(helm_values: dict) -> str:
    (dep,) = helm_values["dagster-user-deployments"]["deployments"]
    return f"{dep['image']['repository']}:{dep['image']['tag']}"


def _dockerfile_arg(name: str) -> str:
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.startswith(f"ARG {name}="):
            return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError(f"deploy/Dockerfile has no ARG {name}")


def _ray_extra() -> dict[str, Requirement]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    reqs = [Requirement(r) for r in pyproject["project"]["optional-dependencies"]["ray"]]
    return {r.name: r for r in reqs}


# ------------------------------------------------------------------ the manifest's shape
def test_raycluster_uses_kuberays_fields(cluster):
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["kind"] == "RayCluster"
    assert set(cluster) == {"apiVersion", "kind", "metadata", "spec"}
    spec = cluster["spec"]
    assert not set(spec) - RAYCLUSTER_SPEC_KEYS
    head = spec["headGroupSpec"]
    assert HEAD_GROUP_REQUIRED <= set(head) and not set(head) - HEAD_GROUP_KEYS
    assert spec["workerGroupSpecs"]
    for group in spec["workerGroupSpecs"]:
        assert WORKER_GROUP_REQUIRED <= set(group), group["groupName"]
        assert not set(group) - WORKER_GROUP_KEYS, group["groupName"]
    assert not set(spec.get("autoscalerOptions", {})) - AUTOSCALER_KEYS
    # map[string]string in the CRD: a YAML number here is rejected by the API server
    for params in [head["rayStartParams"]] + [g["rayStartParams"]
                                              for g in spec["workerGroupSpecs"]]:
        assert all(isinstance(v, str) for v in params.values()), params


def test_pod_templates_are_kubernetes_pod_templates(cluster):
    """Each template through the Kubernetes client's own models and back: unchanged."""
    from kubernetes.client import ApiClient

    api = ApiClient()
    spec = cluster["spec"]
    templates = [spec["headGroupSpec"]["template"]] + [g["template"]
                                                      for g in spec["workerGroupSpecs"]]
    for template in templates:
        model = api._ApiClient__deserialize(copy.deepcopy(template), "V1PodTemplateSpec")  # noqa: SLF001
        assert api.sanitize_for_serialization(model) == template


def test_the_round_trip_catches_a_misspelt_field(cluster):
    from kubernetes.client import ApiClient

    api = ApiClient()
    template = copy.deepcopy(cluster["spec"]["headGroupSpec"]["template"])
    template["spec"]["containers"][0]["envFrm"] = template["spec"]["containers"][0]["envFrom"]
    model = api._ApiClient__deserialize(copy.deepcopy(template), "V1PodTemplateSpec")  # noqa: SLF001
    assert api.sanitize_for_serialization(model) != template


# ------------------------------------------------------------------ the manifest's content
def test_ray_nodes_run_the_charts_image(cluster, helm_values):
    image = _chart_image(helm_values)
    for group, container in _containers(cluster):
        assert container["image"] == image, group
    # the autoscaler sidecar defaults to the head's image: not overridden
    assert "image" not in cluster["spec"].get("autoscalerOptions", {})
    assert cluster["metadata"]["namespace"] == \
        helm_values["runLauncher"]["config"]["k8sRunLauncher"]["jobNamespace"]


def test_ray_version_is_the_images_and_the_projects(cluster):
    ray_version = cluster["spec"]["rayVersion"]
    assert isinstance(ray_version, str)
    assert ray_version == _dockerfile_arg("RAY_VERSION")
    extra = _ray_extra()
    assert Version(ray_version) in extra["ray"].specifier, (ray_version, str(extra["ray"]))
    assert "data" in extra["ray"].extras
    # the image installs that Ray with the extra's other requirement, as the pyproject says
    docker = (DEPLOY / "Dockerfile").read_text()
    assert '"ray[data,default]==${RAY_VERSION}"' in docker
    (dagster_ray,) = re.findall(r'"(dagster-ray[^"]*)"', docker)
    assert Requirement(dagster_ray).specifier == extra["dagster-ray"].specifier
    # KubeRay's HTTP probes (no wget in python:3.11-slim) need Ray >= 2.53
    assert Version(ray_version) >= Version("2.53.0")
    ray = pytest.importorskip("ray")
    assert Version(ray.__version__).release[:2] == Version(ray_version).release[:2], \
        "the venv's Ray (what the tests and benches ran) and the cluster's differ in major.minor"


def test_every_container_has_cpu_and_memory_requests_and_limits(cluster):
    containers = _containers(cluster) + [("autoscaler", cluster["spec"]["autoscalerOptions"])]
    for group, c in containers:
        res = c["resources"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(res[kind]), (group, kind)
        assert _quantity(res["requests"]["memory"]) == _quantity(res["limits"]["memory"]), group
        assert _quantity(res["requests"]["cpu"]) <= _quantity(res["limits"]["cpu"]), group


def test_workers_memory_is_bounded_and_holds_the_object_store(cluster):
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    for group in spec["workerGroupSpecs"]:
        name = group["groupName"]
        assert 0 <= group["minReplicas"] <= group.get("replicas", group["minReplicas"]) \
            <= group["maxReplicas"], name
        assert group["maxReplicas"] > group["minReplicas"], name
        (c,) = group["template"]["spec"]["containers"]
        limits = c["resources"]["limits"]
        params = group["rayStartParams"]
        # one task per CPU (RayTasks asks for num_cpus=1): Ray's slots = the pod's CPUs
        assert _quantity(params["num-cpus"]) == _quantity(limits["cpu"]), name
        store = int(params["object-store-memory"])
        memory = _quantity(limits["memory"])
        # what the manifest's comment promises: ~2 shards of W = 2 GiB per CPU, the object
        # store and ~1 GiB of Ray and Python, inside the limit
        assert _quantity(params["num-cpus"]) * 2 * 2 * 2**30 + store + 2**30 <= memory, name
        assert store <= 0.3 * memory, name


def test_head_exposes_the_ray_client_port_and_runs_no_tasks(cluster):
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    (c,) = head["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["client"] == CLIENT_PORT  # KubeRay's name for the Ray Client port
    assert ports["gcs-server"] == 6379 and ports["dashboard"] == 8265
    store = int(head["rayStartParams"]["object-store-memory"])
    assert store < _quantity(c["resources"]["limits"]["memory"])


def test_ray_nodes_get_the_charts_object_store_secret(cluster, helm_values):
    secret = k8s.DEFAULTS[k8s.ENV_SECRET]
    (dep,) = helm_values["dagster-user-deployments"]["deployments"]
    chart = {s["name"] for s in dep["envSecrets"]}
    launcher = {s["name"] for s in
                helm_values["runLauncher"]["config"]["k8sRunLauncher"]["envSecrets"]}
    assert chart == launcher == {secret}
    for group, c in _containers(cluster):
        assert {e["secretRef"]["name"] for e in c["envFrom"] if "secretRef" in e} == \
            {secret}, group


# ------------------------------------------------------------------ the Helm wiring
def helm_merge(base, override):
    """Values of `helm -f base -f override`: maps merged key by key, anything else (lists,
    scalars) replaced by the later file; a null deletes the key (Helm's coalescing)."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return copy.deepcopy(override)
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif key in out:
            out[key] = helm_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def test_helm_merge_replaces_lists():
    assert helm_merge({"a": {"l": [1, 2], "k": 1}}, {"a": {"l": [3]}}) == \
        {"a": {"l": [3], "k": 1}}
    assert helm_merge({"a": 1, "b": 2}, {"b": None}) == {"a": 1}


def _address(cluster: dict) -> str:
    return f"ray://{cluster['metadata']['name']}-head-svc:{CLIENT_PORT}"


def _without_ray(values: dict) -> dict:
    v = copy.deepcopy(values)
    for dep in v["dagster-user-deployments"]["deployments"]:
        dep["env"] = [e for e in dep["env"] if e["name"] != VAR]
    kl = v["runLauncher"]["config"]["k8sRunLauncher"]
    kl["envVars"] = [e for e in kl["envVars"] if not e.startswith(f"{VAR}=")]
    return v


def test_ray_overlay_sets_the_address_and_nothing_else(helm_values, ray_overlay, cluster):
    merged = helm_merge(helm_values, ray_overlay)
    k8s_tests.test_helm_values_use_the_charts_keys(merged)
    assert _without_ray(merged) == helm_values

    address = _address(cluster)
    (dep,) = merged["dagster-user-deployments"]["deployments"]
    assert {e["name"]: e["value"] for e in dep["env"]}[VAR] == address
    assert dep["includeConfigInLaunchedRuns"] == {"enabled": True}
    assert f"{VAR}={address}" in merged["runLauncher"]["config"]["k8sRunLauncher"]["envVars"]

    # the resource reads it as the dagster-ray cluster address (Ray Client)
    from resources.ray import RayCluster

    resource = RayCluster(address=address)
    assert resource.host == f"{cluster['metadata']['name']}-head-svc"
    if hasattr(resource, "ray_address"):
        assert resource.ray_address == address


def test_without_the_overlay_ray_is_local(helm_values):
    assert VAR not in json.dumps(helm_values)
    assert VAR not in (DEPLOY / "dagster.yaml").read_text()
    assert VAR not in (DEPLOY / "k8s_executor.yaml").read_text()


def test_step_pods_get_the_address(helm_values, ray_overlay, cluster, tmp_path, monkeypatch):
    """The merged launcher section, as the chart renders it into the instance, given to
    dagster-k8s's K8sRunLauncher; the step pods its k8s_job_executor builds carry the
    address (the corpus steps are step pods: they connect from there)."""
    from dagster._core.test_utils import instance_for_test

    for name in k8s.DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    merged = helm_merge(helm_values, ray_overlay)
    instance_yaml = _yaml(DEPLOY / "dagster.yaml")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(k8s_tests.KUBECONFIG)
    launcher = k8s_tests._launcher_for_test(instance_yaml, str(kubeconfig))  # noqa: SLF001
    rendered = k8s_tests._helm_launcher_as_instance_config(  # noqa: SLF001
        merged["runLauncher"]["config"]["k8sRunLauncher"])
    launcher["config"]["env_vars"] = rendered["env_vars"]
    with instance_for_test(overrides={"run_launcher": launcher}) as instance:
        jobs = k8s_tests._launch_step_pods(instance, k8s.k8s_executor_config())  # noqa: SLF001
    assert jobs
    for key, job in jobs.items():
        env = {e.name: e.value for e in job.spec.template.spec.containers[0].env}
        assert env.get(VAR) == _address(cluster), key


# ------------------------------------------------------------------ optional: KubeRay's CRD
def _strict(schema: dict, value, path: str = "") -> list[str]:
    """Fields the structural schema does not define (the API server's strict field
    validation); jsonschema checks types, required fields and enums."""
    errors: list[str] = []
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return errors
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in value.items():
            if key not in schema["properties"]:
                errors.append(f"{path}.{key}")
            else:
                errors += _strict(schema["properties"][key], sub, f"{path}.{key}")
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, sub in value.items():
            errors += _strict(schema["additionalProperties"], sub, f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, sub in enumerate(value):
            errors += _strict(schema["items"], sub, f"{path}[{i}]")
    return errors


@pytest.mark.skipif(not os.environ.get("DATAMASK_KUBERAY_CRD"),
                    reason="set DATAMASK_KUBERAY_CRD to KubeRay's ray.io_rayclusters.yaml")
def test_manifest_against_kuberays_crd(cluster):
    import jsonschema

    crd = _yaml(Path(os.environ["DATAMASK_KUBERAY_CRD"]))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = version["schema"]["openAPIV3Schema"]
    body = {k: v for k, v in cluster.items() if k not in ("apiVersion", "kind", "metadata")}
    sub = {**schema, "properties": {k: v for k, v in schema["properties"].items()
                                    if k in ("spec", "status")}}
    jsonschema.validate(body, sub)
    assert _strict(sub, body) == []
    bad = copy.deepcopy(body)
    bad["spec"]["workerGroupSpecs"][0]["maxReplica"] = 3
    assert _strict(sub, bad) == [".spec.workerGroupSpecs[0].maxReplica"]
