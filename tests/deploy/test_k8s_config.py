"""The Kubernetes deployment (deploy/) checked against dagster-k8s's and dagster's own code.

No cluster, no helm, no docker engine are needed: everything here runs the same parsing,
validation and Job-construction code a real deployment runs, and stops where a Kubernetes API
call would be made (the batch API client is a mock that records the Job body it was given).

* deploy/dagster.yaml: dagster's instance schema, K8sRunLauncher.config_type(),
  QueuedRunCoordinator.config_type(), and an instance actually built from its sections.
* deploy/k8s_executor.yaml and k8s.k8s_executor_config(): k8s_job_executor's config schema,
  and a job's run-config schema.
* k8s.gpu_op_tags() / cpu_op_tags(): dagster_k8s.job.get_user_defined_k8s_config (the parser
  k8s_job_executor applies to every step's tags) and construct_dagster_k8s_job.
* The step pods of a stand-in of the pipeline's chain (tests/deploy/k8s_stand_in.py), built by
  dagster-k8s's K8sStepHandler.launch_step with the instance's K8sRunLauncher and the
  executor's config: the mask pod gets nvidia.com/gpu and the GPU node selector and nothing
  that keeps it off GPU nodes; CPU pods get no GPU and stay off GPU nodes.
* The gpu pool limit of deploy/dagster.yaml, enforced by dagster's own slot claims.
* deploy/helm/values.yaml: a structural check (keys the official chart's schema models
  define; not rendered with helm) and equivalence with deploy/dagster.yaml, with the launcher
  section translated to snake_case and validated by K8sRunLauncher's schema.
* deploy/Dockerfile: static checks (base image, command, port).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from unittest import mock

import dagster as dg
import pytest
import yaml
from dagster._config import process_config, resolve_to_config_type
from dagster._core.definitions.reconstruct import reconstructable
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.execution.api import create_execution_plan
from dagster._core.execution.context.system import PlanData, PlanOrchestrationContext
from dagster._core.execution.context_creation_job import create_context_free_log_manager
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext
from dagster._core.execution.retries import RetryMode
from dagster._core.executor.init import InitExecutorContext
from dagster._core.executor.step_delegating.step_handler.base import StepHandlerContext
from dagster._core.instance.config import dagster_instance_config
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster._core.test_utils import create_run_for_test, instance_for_test
from dagster._grpc.types import ExecuteStepArgs
from dagster_k8s import K8sRunLauncher, k8s_job_executor
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import (
    USER_DEFINED_K8S_CONFIG_KEY,
    DagsterK8sJobConfig,
    K8sConfigMergeBehavior,
    UserDefinedDagsterK8sConfig,
    construct_dagster_k8s_job,
    get_user_defined_k8s_config,
)

from datamask_pipeline import k8s
from tests.deploy import k8s_stand_in

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
GPU = "nvidia.com/gpu"
GPU_LABEL = ("nvidia.com/gpu.present", "true")
IMAGE = "registry.example.com/datamask:test"

KUBECONFIG = """\
apiVersion: v1
kind: Config
current-context: test
contexts:
  - name: test
    context: {cluster: test}
clusters:
  - name: test
    cluster: {}
"""


def _yaml(path: Path):
    with open(path) as fh:
        return yaml.safe_load(fh)


@pytest.fixture(scope="module")
def instance_yaml() -> dict:
    return _yaml(DEPLOY / "dagster.yaml")


@pytest.fixture(scope="module")
def helm_values() -> dict:
    return _yaml(DEPLOY / "helm" / "values.yaml")


@pytest.fixture
def no_k8s_env(monkeypatch):
    """The defaults, whatever DATAMASK_K8S_* the developer's shell has."""
    for name in k8s.DEFAULTS:
        monkeypatch.delenv(name, raising=False)


# ------------------------------------------------------------------ helpers
def _process(config_type, value) -> dict:
    result = process_config(resolve_to_config_type(config_type), value)
    if not result.success:
        raise AssertionError("; ".join(e.message for e in result.errors))
    return result.value


def _invalid(config_type, value) -> bool:
    return not process_config(resolve_to_config_type(config_type), value).success


def _quantities(resources) -> dict:
    """V1ResourceRequirements -> {"requests": {...}, "limits": {...}} (absent -> {})."""
    return {"requests": dict(resources.requests or {}), "limits": dict(resources.limits or {})}


def _excluding_terms(affinity):
    """Required node-affinity match expressions of a pod spec's affinity (model or None)."""
    if affinity is None or affinity.node_affinity is None:
        return []
    req = affinity.node_affinity.required_during_scheduling_ignored_during_execution
    if req is None:
        return []
    return [e for t in req.node_selector_terms for e in (t.match_expressions or [])]


def assert_schedulable_on_gpu_nodes(pod_spec) -> None:
    """A node matching the pod's node selector must not be excluded by its required affinity."""
    selector = pod_spec.node_selector or {}
    assert selector, "GPU pod without a node selector"
    for expr in _excluding_terms(pod_spec.affinity):
        if expr.key in selector:
            value = selector[expr.key]
            if expr.operator == "NotIn":
                assert value not in expr.values, f"affinity {expr} excludes the GPU nodes"
            if expr.operator == "DoesNotExist":
                raise AssertionError(f"affinity {expr} excludes the GPU nodes")
            if expr.operator == "In":
                assert value in expr.values, f"affinity {expr} excludes the GPU nodes"


def assert_kept_off_gpu_nodes(pod_spec) -> None:
    exprs = _excluding_terms(pod_spec.affinity)
    assert any(
        e.key == GPU_LABEL[0] and e.operator == "NotIn" and GPU_LABEL[1] in e.values
        for e in exprs
    ), f"CPU pod may land on GPU nodes: {exprs}"
    assert GPU_LABEL[0] not in (pod_spec.node_selector or {})


# ------------------------------------------------------------------ op tags
def test_op_tags_parse_with_dagster_k8s(no_k8s_env):
    gpu_tags, cpu_tags = k8s.gpu_op_tags(), k8s.cpu_op_tags()
    assert set(gpu_tags) == {USER_DEFINED_K8S_CONFIG_KEY} == set(cpu_tags)
    assert all(isinstance(v, str) for v in [*gpu_tags.values(), *cpu_tags.values()])

    gpu = get_user_defined_k8s_config(gpu_tags)
    assert isinstance(gpu, UserDefinedDagsterK8sConfig)
    res = gpu.container_config["resources"]
    assert res["limits"][GPU] == "1" and res["requests"][GPU] == "1"
    assert res["requests"]["memory"] == res["limits"]["memory"] == "32Gi"
    assert gpu.pod_spec_config["node_selector"] == {GPU_LABEL[0]: GPU_LABEL[1]}
    assert gpu.pod_spec_config["tolerations"] == [
        {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert gpu.merge_behavior is K8sConfigMergeBehavior.SHALLOW

    cpu = get_user_defined_k8s_config(cpu_tags)
    assert GPU not in json.dumps(cpu.container_config)
    assert cpu.container_config["resources"]["requests"] == {"cpu": "2", "memory": "8Gi"}
    assert cpu.merge_behavior is K8sConfigMergeBehavior.DEEP


def test_dagster_k8s_rejects_a_malformed_tag():
    """The parser used above is a real check: an unknown top-level key fails it."""
    bad = {USER_DEFINED_K8S_CONFIG_KEY: json.dumps({"container_conf": {}})}
    with pytest.raises(DagsterInvalidConfigError):
        get_user_defined_k8s_config(bad)


def test_env_vars_reach_the_tags():
    env = {
        "DATAMASK_K8S_GPU_COUNT": "2",
        "DATAMASK_K8S_GPU_MEMORY": "120Gi",
        "DATAMASK_K8S_GPU_CPU": "16",
        "DATAMASK_K8S_GPU_NODE_SELECTOR": "cloud.google.com/gke-accelerator=nvidia-h100-80gb",
        "DATAMASK_K8S_GPU_TOLERATIONS": "nvidia.com/gpu=present:NoSchedule,spot:NoExecute",
        "DATAMASK_K8S_CPU_NODE_SELECTOR": "pool=cpu",
        "DATAMASK_K8S_CPU_MEMORY": "16Gi",
    }
    gpu = get_user_defined_k8s_config(k8s.gpu_op_tags(env))
    assert gpu.container_config["resources"]["limits"] == {GPU: "2", "memory": "120Gi"}
    assert gpu.container_config["resources"]["requests"]["cpu"] == "16"
    assert gpu.pod_spec_config["node_selector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb"
    }
    assert gpu.pod_spec_config["tolerations"] == [
        {"key": GPU, "operator": "Equal", "value": "present", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists", "effect": "NoExecute"},
    ]
    cpu = get_user_defined_k8s_config(k8s.cpu_op_tags(env))
    assert cpu.pod_spec_config["node_selector"] == {"pool": "cpu"}
    assert cpu.container_config["resources"]["limits"] == {"memory": "16Gi"}
    exprs = cpu.pod_spec_config["affinity"]["node_affinity"][
        "required_during_scheduling_ignored_during_execution"]["node_selector_terms"][0][
        "match_expressions"]
    assert exprs == [{"key": "cloud.google.com/gke-accelerator", "operator": "NotIn",
                      "values": ["nvidia-h100-80gb"]}]
    assert "affinity" not in k8s.cpu_k8s_config(
        {**env, "DATAMASK_K8S_CPU_AVOID_GPU_NODES": "0"})["pod_spec_config"]
    assert k8s.gpu_k8s_config({"DATAMASK_K8S_GPU_NODE_SELECTOR": "none"})[
        "pod_spec_config"]["node_selector"] == {}


@pytest.mark.parametrize(
    "name,value",
    [
        ("DATAMASK_K8S_GPU_COUNT", "0"),
        ("DATAMASK_K8S_GPU_COUNT", "one"),
        ("DATAMASK_K8S_GPU_MEMORY", "32GB"),
        ("DATAMASK_K8S_CPU_CPU", "-1"),
        ("DATAMASK_K8S_GPU_NODE_SELECTOR", "gpu"),
        ("DATAMASK_K8S_GPU_NODE_SELECTOR", "bad key!=x"),
        ("DATAMASK_K8S_GPU_TOLERATIONS", "nvidia.com/gpu:Sometimes"),
        ("DATAMASK_K8S_CPU_AVOID_GPU_NODES", "maybe"),
        ("DATAMASK_K8S_OBJECT_STORE_SECRET", "Bad_Name"),
        ("DATAMASK_K8S_NAMESPACE", "Not A Namespace"),
    ],
)
def test_invalid_env_values_are_refused_by_name(name, value):
    with pytest.raises(ValueError, match=name):
        k8s.gpu_op_tags({name: value})
        k8s.cpu_op_tags({name: value})
        k8s.k8s_executor_config({name: value})


def test_use_k8s_executor_switch():
    assert k8s.use_k8s_executor({}) is False
    assert k8s.use_k8s_executor({"DATAMASK_EXECUTOR": "k8s"}) is True
    with pytest.raises(ValueError, match="DATAMASK_EXECUTOR"):
        k8s.use_k8s_executor({"DATAMASK_EXECUTOR": "kubernetes"})


def test_construct_dagster_k8s_job_puts_the_gpu_on_the_container(no_k8s_env):
    """dagster-k8s's Job builder, fed the parsed tags directly."""
    job_config = DagsterK8sJobConfig(job_image=IMAGE, dagster_home="/opt/dagster/dagster_home",
                                     env_secrets=["datamask-object-store"])
    gpu_job = construct_dagster_k8s_job(
        job_config, ["dagster", "api", "execute_step"], "dagster-step-mask",
        user_defined_k8s_config=get_user_defined_k8s_config(k8s.gpu_op_tags()))
    spec = gpu_job.spec.template.spec
    res = _quantities(spec.containers[0].resources)
    assert res["limits"][GPU] == "1" and res["requests"][GPU] == "1"
    assert spec.node_selector == {GPU_LABEL[0]: GPU_LABEL[1]}
    assert [(t.key, t.operator, t.effect) for t in spec.tolerations] == [
        (GPU, "Exists", "NoSchedule")]
    assert spec.containers[0].env_from[0].secret_ref.name == "datamask-object-store"
    assert_schedulable_on_gpu_nodes(spec)

    cpu_job = construct_dagster_k8s_job(
        job_config, ["dagster", "api", "execute_step"], "dagster-step-features",
        user_defined_k8s_config=get_user_defined_k8s_config(k8s.cpu_op_tags()))
    cspec = cpu_job.spec.template.spec
    cres = _quantities(cspec.containers[0].resources)
    assert GPU not in cres["limits"] and GPU not in cres["requests"]
    assert_kept_off_gpu_nodes(cspec)


# ------------------------------------------------------------------ dagster.yaml
def test_dagster_yaml_passes_dagsters_instance_schema(instance_yaml, monkeypatch):
    for var in ("DAGSTER_PG_HOST", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_DB"):
        monkeypatch.setenv(var, "x")
    config, _ = dagster_instance_config(str(DEPLOY))
    assert config["run_launcher"]["class"] == "K8sRunLauncher"
    assert config["concurrency"]["pools"]["granularity"] == "op"

    # each configurable class's own schema
    launcher = _process(K8sRunLauncher.config_type(), instance_yaml["run_launcher"]["config"])
    assert launcher["load_incluster_config"] is True
    assert launcher["env_secrets"] == ["datamask-object-store"]
    _process(QueuedRunCoordinator.config_type(), instance_yaml["run_coordinator"]["config"])


def test_launcher_schema_check_is_real(instance_yaml):
    cfg = copy.deepcopy(instance_yaml["run_launcher"]["config"])
    assert _invalid(K8sRunLauncher.config_type(), {**cfg, "env_secret": ["typo"]})
    del cfg["instance_config_map"]
    assert _invalid(K8sRunLauncher.config_type(), cfg)


def _launcher_for_test(instance_yaml, kubeconfig: str) -> dict:
    """deploy/dagster.yaml's run launcher, pointed at a stub kubeconfig instead of the
    in-cluster service account (the only change)."""
    launcher = copy.deepcopy(instance_yaml["run_launcher"])
    launcher["config"]["load_incluster_config"] = False
    launcher["config"]["kubeconfig_file"] = kubeconfig
    return launcher


@pytest.fixture
def k8s_instance(instance_yaml, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    overrides = {
        "run_launcher": _launcher_for_test(instance_yaml, str(kubeconfig)),
        **{key: instance_yaml[key] for key in
           ("run_coordinator", "concurrency", "run_monitoring", "run_retries")},
    }
    with instance_for_test(overrides=overrides) as instance:
        yield instance


def test_instance_builds_from_dagster_yaml(k8s_instance, instance_yaml):
    launcher = k8s_instance.run_launcher
    assert isinstance(launcher, K8sRunLauncher)
    assert launcher.job_namespace == "dagster"
    assert launcher.env_secrets == ["datamask-object-store"]
    assert isinstance(k8s_instance.run_coordinator, QueuedRunCoordinator)
    pools = k8s_instance.get_concurrency_config().pool_config
    assert pools.default_pool_limit == instance_yaml["concurrency"]["pools"]["default_limit"]
    assert pools.pool_granularity.value == "op"


def test_gpu_pool_admits_as_many_mask_steps_as_gpus(k8s_instance, instance_yaml):
    """N = the pool limit: N mask steps (one per shard run) hold a slot, the next one waits
    until one is freed. This is the claim dagster's executors make before starting a step."""
    limit = instance_yaml["concurrency"]["pools"]["default_limit"]
    assert k8s_instance.event_log_storage.supports_global_concurrency_limits
    contexts = []
    try:
        for _ in range(limit + 1):
            run = create_run_for_test(k8s_instance, job_name="datamask_job")
            ctx = InstanceConcurrencyContext(k8s_instance, run).__enter__()
            contexts.append(ctx)
        claimed = [ctx.claim(k8s.GPU_POOL, "mask") for ctx in contexts]
        assert claimed == [True] * limit + [False]
        contexts[0].free_step("mask")
        contexts[-1]._pending_timeouts.clear()  # re-check now instead of after the back-off
        assert contexts[-1].claim(k8s.GPU_POOL, "mask") is True
    finally:
        for ctx in contexts:
            ctx.__exit__(None, None, None)


# ------------------------------------------------------------------ executor config
def test_executor_snippet_is_the_function_and_passes_the_executor_schema(no_k8s_env):
    snippet = _yaml(DEPLOY / "k8s_executor.yaml")
    assert snippet == {"execution": {"config": k8s.k8s_executor_config()}}
    schema = k8s_job_executor.config_schema.config_type
    value = _process(schema, snippet["execution"]["config"])
    assert value["env_secrets"] == ["datamask-object-store"]
    assert _invalid(schema, {**snippet["execution"]["config"], "step_k8s_cfg": {}})

    job = k8s_stand_in.get_job()
    assert dg.validate_run_config(job, snippet)
    with pytest.raises(DagsterInvalidConfigError):
        dg.validate_run_config(job, {"execution": {"config": {"max_concurent": 2}}})


# ------------------------------------------------------------------ step pods, end to end
def _launch_step_pods(instance, executor_config: dict) -> dict:
    """Run K8sStepHandler.launch_step for every step of the stand-in chain; return the V1Job
    bodies it would have created, by step key."""
    recon = reconstructable(k8s_stand_in.get_job)
    origin = recon.get_python_origin()
    # the code server reports its image (Helm sets it on the code location); runs carry it
    origin = origin._replace(
        repository_origin=origin.repository_origin._replace(container_image=IMAGE))
    executor = k8s_job_executor.executor_creation_fn(
        InitExecutorContext(
            job=recon,
            executor_def=k8s_job_executor,
            executor_config=_process(k8s_job_executor.config_schema.config_type,
                                     executor_config),
            instance=instance,
        )
    )
    handler = executor._step_handler  # noqa: SLF001 - the object the executor delegates to
    run = create_run_for_test(instance, job_name="datamask_job", job_code_origin=origin)
    plan = create_execution_plan(recon)
    plan_context = PlanOrchestrationContext(
        plan_data=PlanData(job=recon, dagster_run=run, instance=instance,
                           execution_plan=plan, raise_on_error=True,
                           retry_mode=RetryMode.DISABLED),
        log_manager=create_context_free_log_manager(instance, run),
        executor=executor,
        output_capture=None,
    )
    jobs = {}
    for step in plan.steps:
        batch_api = mock.MagicMock()
        handler._api_client.batch_api = batch_api  # noqa: SLF001 - stop before the API call
        ctx = StepHandlerContext(
            instance=instance, plan_context=plan_context, steps=plan.steps,
            execute_step_args=ExecuteStepArgs(origin, run.run_id, [step.key]))
        list(handler.launch_step(ctx))
        (name, _args, kwargs), = [c for c in batch_api.method_calls
                                  if c[0] == "create_namespaced_job"]
        assert kwargs["namespace"] == "dagster"
        jobs[step.key] = kwargs["body"]
    return jobs


def test_step_pods_as_the_executor_builds_them(k8s_instance, no_k8s_env):
    jobs = _launch_step_pods(k8s_instance, k8s.k8s_executor_config())
    assert set(jobs) == {"features", "mask", "selected_subset"}

    mask = jobs["mask"].spec.template.spec
    container = mask.containers[0]
    assert container.image == IMAGE
    res = _quantities(container.resources)
    assert res["limits"][GPU] == "1" and res["requests"][GPU] == "1"
    assert res["limits"]["memory"] == "32Gi"
    assert mask.node_selector == {GPU_LABEL[0]: GPU_LABEL[1]}
    assert any(t.key == GPU for t in mask.tolerations)
    assert_schedulable_on_gpu_nodes(mask)
    secrets = {e.secret_ref.name for e in container.env_from if e.secret_ref}
    assert "datamask-object-store" in secrets
    env = {e.name: e.value for e in container.env}
    assert env.get("DATAMASK_EXECUTOR") == "k8s"  # from the launcher's env_vars
    assert env.get("DAGSTER_RUN_STEP_KEY") == "mask"

    for key in ("features", "selected_subset"):  # tagged and untagged CPU steps
        spec = jobs[key].spec.template.spec
        cres = _quantities(spec.containers[0].resources)
        assert GPU not in cres["limits"] and GPU not in cres["requests"], key
        assert cres["requests"] == {"cpu": "2", "memory": "8Gi"}, key
        assert not any(t.key == GPU for t in (spec.tolerations or [])), key
        assert_kept_off_gpu_nodes(spec)
        assert "datamask-object-store" in {
            e.secret_ref.name for e in spec.containers[0].env_from if e.secret_ref}


def test_a_deep_merged_gpu_tag_would_be_unschedulable(no_k8s_env):
    """Why the GPU tag is SHALLOW: merged DEEP over the executor's CPU default it would keep
    the CPU pods' 'not on GPU nodes' affinity. The schedulability check above catches it."""
    deep = k8s.gpu_k8s_config()
    deep.pop("merge_behavior")
    deep["pod_spec_config"].pop("affinity")
    # Merge the way K8sStepHandler._get_container_context does: executor default, then tag.
    base = K8sContainerContext(run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(
        k8s.k8s_executor_config()["step_k8s_config"]))
    merged = base.merge(K8sContainerContext(
        run_k8s_config=get_user_defined_k8s_config(
            {USER_DEFINED_K8S_CONFIG_KEY: json.dumps(deep)})))
    job = construct_dagster_k8s_job(DagsterK8sJobConfig(job_image=IMAGE), None, "deep",
                                    user_defined_k8s_config=merged.run_k8s_config)
    with pytest.raises(AssertionError, match="excludes the GPU nodes"):
        assert_schedulable_on_gpu_nodes(job.spec.template.spec)

    shallow = base.merge(K8sContainerContext(
        run_k8s_config=get_user_defined_k8s_config(k8s.gpu_op_tags())))
    job = construct_dagster_k8s_job(DagsterK8sJobConfig(job_image=IMAGE), None, "shallow",
                                    user_defined_k8s_config=shallow.run_k8s_config)
    assert_schedulable_on_gpu_nodes(job.spec.template.spec)


# ------------------------------------------------------------------ Helm values
# Keys of the official chart's values (its pydantic schema models, helm/dagster/schema, read
# for this work) for the sections used here. A structural check: it catches misspelt or
# misplaced keys, not every value constraint of the chart's values.schema.json.
HELM_TOP = {"global", "dagsterWebserver", "dagster-user-deployments", "runLauncher",
            "dagsterDaemon", "concurrency", "postgresql", "telemetry", "imagePullSecrets",
            "computeLogManager", "pythonLogs", "serviceAccount", "retention", "ingress",
            "generatePostgresqlPasswordSecret", "additionalInstanceConfig", "scheduler",
            "migrate", "busybox", "rabbitmq", "redis", "flower", "generateCeleryConfigSecret"}
USER_DEPLOYMENT_KEYS = {
    "name", "image", "dagsterApiGrpcArgs", "codeServerArgs", "includeConfigInLaunchedRuns",
    "deploymentNamespace", "port", "replicaCount", "env", "envConfigMaps", "envSecrets",
    "annotations", "nodeSelector", "affinity", "tolerations", "podSecurityContext",
    "securityContext", "resources", "livenessProbe", "readinessProbe", "startupProbe",
    "labels", "volumeMounts", "volumes", "schedulerName", "initContainers",
    "sidecarContainers", "deploymentStrategy"}
K8S_LAUNCHER_KEYS = {
    "image", "imagePullPolicy", "jobNamespace", "loadInclusterConfig", "kubeconfigFile",
    "envConfigMaps", "envSecrets", "envVars", "volumeMounts", "volumes", "labels",
    "failPodOnRunFailure", "resources", "schedulerName", "securityContext", "runK8sConfig"}
K8S_LAUNCHER_REQUIRED = {"imagePullPolicy", "loadInclusterConfig", "envConfigMaps",
                         "envSecrets", "envVars", "volumeMounts", "volumes"}
QUEUED_COORDINATOR_KEYS = {"maxConcurrentRuns", "tagConcurrencyLimits",
                           "dequeueIntervalSeconds", "dequeueNumWorkers", "dequeueUseThreads",
                           "blockOpConcurrencyLimitedRuns"}
DAEMON_KEYS = {"enabled", "image", "runCoordinator", "heartbeatTolerance", "env",
               "envConfigMaps", "envSecrets", "deploymentLabels", "labels", "nodeSelector",
               "affinity", "tolerations", "podSecurityContext", "securityContext", "resources",
               "checkDbReadyInitContainer", "livenessProbe", "readinessProbe", "startupProbe",
               "annotations", "runMonitoring", "runRetries", "sensors", "schedules",
               "backfills", "schedulerName", "logFormat", "volumeMounts", "volumes",
               "initContainerResources", "extraContainers", "extraPrependedInitContainers"}
CONCURRENCY_KEYS = {"enabled": None, "pools": {"defaultLimit", "granularity",
                                               "opGranularityRunBuffer"},
                    "runs": {"maxConcurrentRuns", "tagConcurrencyLimits"}}
RUN_MONITORING_KEYS = {"enabled", "startTimeoutSeconds", "pollIntervalSeconds",
                       "maxResumeRunAttempts", "freeSlotsAfterRunEndSeconds",
                       "cancelTimeoutSeconds", "maxRuntimeSeconds"}


def _unknown(keys, allowed) -> set:
    return set(keys) - set(allowed)


GLOBAL_KEYS = {"postgresqlSecretName", "dagsterHome", "serviceAccountName",
               "celeryConfigSecretName", "dagsterInstanceConfigMap"}


def test_helm_values_use_the_charts_keys(helm_values):
    v = helm_values
    assert not _unknown(v, HELM_TOP)
    assert not _unknown(v["global"], GLOBAL_KEYS)
    assert set(v["telemetry"]) == {"enabled"} and set(v["postgresql"]) == {"enabled"}

    uds = v["dagster-user-deployments"]
    assert uds["enabled"] is True and uds["enableSubchart"] is True
    (dep,) = uds["deployments"]
    assert not _unknown(dep, USER_DEPLOYMENT_KEYS)
    assert {"name", "image", "port"} <= set(dep)
    assert set(dep["image"]) == {"repository", "tag", "pullPolicy"}
    assert dep["includeConfigInLaunchedRuns"] == {"enabled": True}
    assert all(set(s) == {"name"} for s in dep["envSecrets"])
    assert all(set(e) <= {"name", "value", "valueFrom"} for e in dep["env"])

    rl = v["runLauncher"]
    assert rl["type"] == "K8sRunLauncher" and set(rl) == {"type", "config"}
    assert set(rl["config"]) == {"k8sRunLauncher"}
    kl = rl["config"]["k8sRunLauncher"]
    assert not _unknown(kl, K8S_LAUNCHER_KEYS)
    assert K8S_LAUNCHER_REQUIRED <= set(kl)
    assert kl["imagePullPolicy"] in ("Always", "IfNotPresent", "Never")

    d = v["dagsterDaemon"]
    assert not _unknown(d, DAEMON_KEYS)
    rc = d["runCoordinator"]
    assert rc["enabled"] is True and rc["type"] == "QueuedRunCoordinator"
    assert not _unknown(rc["config"]["queuedRunCoordinator"], QUEUED_COORDINATOR_KEYS)
    assert not _unknown(d["runMonitoring"], RUN_MONITORING_KEYS)
    assert not _unknown(d["runRetries"], {"enabled", "maxRetries", "retryOnAssetOrOpFailure"})

    c = v["concurrency"]
    assert not _unknown(c, CONCURRENCY_KEYS)
    assert c["enabled"] is True
    for section in ("pools", "runs"):
        assert not _unknown(c[section], CONCURRENCY_KEYS[section])
    # the chart refuses run limits set both here and on the queued run coordinator
    assert "maxConcurrentRuns" not in rc["config"]["queuedRunCoordinator"]


def test_helm_structural_check_is_real(helm_values):
    v = copy.deepcopy(helm_values)
    v["runLauncher"]["config"]["k8sRunLauncher"]["envSecret"] = [{"name": "typo"}]
    with pytest.raises(AssertionError):
        test_helm_values_use_the_charts_keys(v)


def _camel_to_snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _helm_launcher_as_instance_config(kl: dict) -> dict:
    """The chart's K8sRunLauncher template, for the keys used here: lists of {name} become
    lists of names, camelCase becomes snake_case, the chart adds the instance ConfigMap, the
    PostgreSQL secret and the service account."""
    out = {}
    for key, value in kl.items():
        if key in ("envSecrets", "envConfigMaps"):
            value = [item["name"] for item in value]
        if key in ("volumeMounts", "volumes") and not value:
            continue
        out["job_namespace" if key == "jobNamespace" else _camel_to_snake(key)] = value
    return out


def test_helm_values_and_dagster_yaml_agree(helm_values, instance_yaml):
    helm_launcher = _helm_launcher_as_instance_config(
        helm_values["runLauncher"]["config"]["k8sRunLauncher"])
    yaml_launcher = instance_yaml["run_launcher"]["config"]
    for key, value in helm_launcher.items():
        if key == "env_config_maps":
            assert value == yaml_launcher.get(key, [])
            continue
        assert yaml_launcher[key] == value, key
    chart_added = {"instance_config_map", "postgres_password_secret", "service_account_name"}
    assert set(yaml_launcher) - set(helm_launcher) == chart_added
    assert helm_values["global"]["serviceAccountName"] == yaml_launcher["service_account_name"]
    # what the chart renders validates against dagster-k8s's own launcher schema
    _process(K8sRunLauncher.config_type(),
             {**helm_launcher, **{k: yaml_launcher[k] for k in chart_added}})

    hc, yc = helm_values["concurrency"], instance_yaml["concurrency"]
    assert hc["pools"] == {
        "defaultLimit": yc["pools"]["default_limit"],
        "granularity": yc["pools"]["granularity"],
        "opGranularityRunBuffer": yc["pools"]["op_granularity_run_buffer"],
    }
    assert hc["runs"] == {"maxConcurrentRuns": yc["runs"]["max_concurrent_runs"]}

    d = helm_values["dagsterDaemon"]
    assert {_camel_to_snake(k): val for k, val in d["runMonitoring"].items()} == \
        instance_yaml["run_monitoring"]
    assert {_camel_to_snake(k): val for k, val in d["runRetries"].items()} == \
        instance_yaml["run_retries"]
    qrc = d["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert {_camel_to_snake(k): val for k, val in qrc.items()} == \
        instance_yaml["run_coordinator"]["config"]
    assert helm_values["telemetry"] == instance_yaml["telemetry"]

    # the same Secret feeds the code server, the run workers and the step pods
    (dep,) = helm_values["dagster-user-deployments"]["deployments"]
    secret = k8s.DEFAULTS[k8s.ENV_SECRET]
    assert {s["name"] for s in dep["envSecrets"]} == {secret}
    assert yaml_launcher["env_secrets"] == [secret]
    assert {e["name"]: e["value"] for e in dep["env"]}["DATAMASK_EXECUTOR"] == "k8s"
    assert "DATAMASK_EXECUTOR=k8s" in yaml_launcher["env_vars"]


# ------------------------------------------------------------------ Dockerfile
def _dockerfile() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_matches_the_helm_code_location(helm_values):
    instrs = _dockerfile()
    assert [rest for word, rest in instrs if word == "FROM"] == ["python:3.11-slim"]
    (cmd,) = [json.loads(rest) for word, rest in instrs if word == "CMD"]
    assert cmd[:3] == ["dagster", "code-server", "start"]
    (dep,) = helm_values["dagster-user-deployments"]["deployments"]
    port = str(dep["port"])
    assert cmd[cmd.index("-p") + 1] == port
    assert [rest for word, rest in instrs if word == "EXPOSE"] == [port]
    # the chart runs `dagster code-server start -h 0.0.0.0 -p <port> <codeServerArgs>`
    assert cmd[cmd.index("-p") + 2:] == dep["codeServerArgs"]
    assert dep["codeServerArgs"] == ["-m", "datamask_pipeline.definitions"]
    runs = " ".join(rest for word, rest in instrs if word == "RUN")
    assert "pip install . $DAGSTER_INTEGRATIONS" in runs
    (integrations,) = [rest for word, rest in instrs
                       if word == "ARG" and rest.startswith("DAGSTER_INTEGRATIONS=")]
    assert "dagster-k8s>=0.29,<0.30" in integrations
    assert "dagster-postgres>=0.29,<0.30" in integrations
    # torch is not pinned to a CPU build by default (pip's default, the CUDA wheel, on GPU)
    assert 'pip install "torch>=2.2"' in runs and "+cpu" not in runs
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignore and ".git" in ignore


# ------------------------------------------------------------------ the real definitions
def test_real_mask_asset_carries_the_gpu_tags(no_k8s_env):
    """Once datamask_pipeline/definitions.py exists, its mask asset must carry the GPU tag and
    the pool, and no other asset may ask for a GPU."""
    import importlib.util

    if importlib.util.find_spec("datamask_pipeline.definitions") is None:
        pytest.skip("datamask_pipeline/definitions.py does not exist yet")
    from datamask_pipeline.definitions import defs

    graph = defs.resolve_asset_graph()
    mask_key = dg.AssetKey("mask")
    mask_op = graph.get(mask_key).assets_def.op
    assert mask_op.pool == k8s.GPU_POOL
    assert USER_DEFINED_K8S_CONFIG_KEY in mask_op.tags, \
        "wire op_tags=k8s.gpu_op_tags() into the mask asset"
    parsed = get_user_defined_k8s_config(mask_op.tags)
    assert GPU in parsed.container_config["resources"]["limits"]
    for key in graph.get_all_asset_keys():
        if key == mask_key or not graph.get(key).is_materializable:
            continue
        other = graph.get(key).assets_def.op.tags
        assert GPU not in json.dumps(other.get(USER_DEFINED_K8S_CONFIG_KEY, "")), key
