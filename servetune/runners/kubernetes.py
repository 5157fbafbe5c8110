"""A Pod (and Service) for the engine, built with the kubernetes client's models and validated.

servetune does not apply it (no cluster is reachable from CI): ``servetune serve --runner
kubernetes --dry-run`` prints the YAML and docs/engines.md shows the kubectl steps. The readiness
probe is the same /health_generate the local lifecycle polls, so "Ready" means "serves".
Secret flags are not on the container's command: vLLM's go to its env, SGLang's to a ``Secret``
mounted 0400 and read with ``--config`` (``lifecycle.secure_launch``).
"""

from __future__ import annotations

from typing import Any

import yaml

from servetune.engines.common import EngineBase
from servetune.runners.base import KubernetesRunnerConfig, gpu_env

SECRETS_MOUNT = "/etc/servetune-secrets"


class ManifestError(ValueError):
    pass


def build_manifests(engine: EngineBase, runner: KubernetesRunnerConfig) -> list[dict[str, Any]]:
    """``[pod]`` or ``[pod, service]`` as plain dicts (what ``kubectl apply -f`` takes)."""
    from kubernetes import client

    if not engine.launches:
        raise ManifestError(f"an {engine.kind} endpoint is not launched, so it has no Pod")
    from servetune.runners.lifecycle import secure_launch

    argv = engine.launch_argv(host="0.0.0.0", port=runner.container_port)  # reached through the pod IP
    if argv[0].startswith("/") and "python" in argv[0]:
        argv = ["python3", *argv[1:]]  # a host interpreter path means nothing inside the image
    argv, env, files = secure_launch(engine, argv)
    env = gpu_env(runner.gpus, env)  # several GPUs in the pod: NVLink multicast off (runners.base)
    labels = {"app.kubernetes.io/name": "servetune-engine", "app.kubernetes.io/instance": runner.name,
              "servetune/engine": engine.kind, **runner.labels}
    gpu_limits = {runner.gpu_resource: str(runner.gpus)} if runner.gpus else {}
    probe_path = engine.health_paths[0]
    mounts = [client.V1VolumeMount(name="dshm", mount_path="/dev/shm")]
    volumes = [client.V1Volume(name="dshm", empty_dir=client.V1EmptyDirVolumeSource(medium="Memory",
                                                                                    size_limit=runner.shm_size))]
    if runner.model_pvc:
        mounts.append(client.V1VolumeMount(name="models", mount_path=runner.model_mount, read_only=True))
        volumes.append(client.V1Volume(
            name="models",
            persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(
                claim_name=runner.model_pvc, read_only=True)))
    secret = None
    if files:
        secret = client.V1Secret(api_version="v1", kind="Secret", type="Opaque", string_data=files,
                                 metadata=client.V1ObjectMeta(name=f"{runner.name}-secrets", namespace=runner.namespace,
                                                              labels=labels))
        mounts.append(client.V1VolumeMount(name="secrets", mount_path=SECRETS_MOUNT, read_only=True))
        volumes.append(client.V1Volume(name="secrets", secret=client.V1SecretVolumeSource(
            secret_name=secret.metadata.name, default_mode=0o400)))
        argv += engine.secret_files_argv({name: f"{SECRETS_MOUNT}/{name}" for name in files})
    container = client.V1Container(
        name="engine",
        image=runner.image,
        command=argv,
        env=[client.V1EnvVar(name=k, value=v) for k, v in env.items()],
        ports=[client.V1ContainerPort(name="http", container_port=runner.container_port)],
        resources=client.V1ResourceRequirements(limits=gpu_limits or None, requests=gpu_limits or None),
        readiness_probe=client.V1Probe(
            http_get=client.V1HTTPGetAction(path=probe_path, port="http"),
            period_seconds=10, timeout_seconds=30, failure_threshold=3),
        startup_probe=client.V1Probe(
            http_get=client.V1HTTPGetAction(path="/health" if probe_path == "/health_generate" else probe_path,
                                            port="http"),
            period_seconds=10, failure_threshold=max(1, int(engine.ready_timeout_s // 10))),
        volume_mounts=mounts,
    )
    pod = client.V1Pod(
        api_version="v1", kind="Pod",
        metadata=client.V1ObjectMeta(name=runner.name, namespace=runner.namespace, labels=labels),
        spec=client.V1PodSpec(containers=[container], volumes=volumes, restart_policy="Never",
                              node_selector=runner.node_selector or None,
                              termination_grace_period_seconds=int(runner.grace_s)),
    )
    out = [secret, pod] if secret is not None else [pod]
    if runner.service:
        out.append(client.V1Service(
            api_version="v1", kind="Service",
            metadata=client.V1ObjectMeta(name=runner.name, namespace=runner.namespace, labels=labels),
            spec=client.V1ServiceSpec(selector={"app.kubernetes.io/instance": runner.name},
                                      ports=[client.V1ServicePort(name="http", port=runner.container_port,
                                                                  target_port="http")])))
    manifests = [client.ApiClient().sanitize_for_serialization(obj) for obj in out]
    for m in manifests:
        validate_manifest(m)
    return manifests


def validate_manifest(m: dict[str, Any]) -> None:
    """The fields the API server would reject us for, checked before anyone runs kubectl."""
    where = f"{m.get('kind', '?')}/{m.get('metadata', {}).get('name', '?')}"
    if m.get("kind") == "Secret" and not (m.get("stringData") or m.get("data")):
        raise ManifestError(f"{where}: a Secret needs stringData")
    for key in ("apiVersion", "kind", "metadata", *(() if m.get("kind") == "Secret" else ("spec",))):
        if not m.get(key):
            raise ManifestError(f"{where}: missing {key}")
    if not m["metadata"].get("name"):
        raise ManifestError(f"{where}: metadata.name is required")
    if m["kind"] == "Pod":
        containers = m["spec"].get("containers") or []
        if not containers:
            raise ManifestError(f"{where}: spec.containers is empty")
        for c in containers:
            for key in ("name", "image"):
                if not c.get(key):
                    raise ManifestError(f"{where}: container {key} is required")
            probe = c.get("readinessProbe", {}).get("httpGet", {})
            if not probe.get("path") or not probe.get("port"):
                raise ManifestError(f"{where}: container {c['name']} needs an httpGet readiness probe")
        mounted = {vm["name"] for c in containers for vm in c.get("volumeMounts", [])}
        declared = {v["name"] for v in m["spec"].get("volumes", [])}
        if mounted - declared:
            raise ManifestError(f"{where}: volume mounts without volumes: {sorted(mounted - declared)}")
    if m["kind"] == "Service" and not m["spec"].get("ports"):
        raise ManifestError(f"{where}: spec.ports is empty")


def manifests_yaml(manifests: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(manifests, sort_keys=False)
