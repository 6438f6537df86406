"""The Helm chart (helm/rmqstore) and the container image (Dockerfile), checked offline.

The chart is linted and rendered by Helm's own Go SDK through helm-python-sdk (no helm
binary, no cluster), for the defaults and for each mode; the tests then assert on the
rendered objects, validate every one against the Kubernetes API schemas that
kubernetes-validate ships, and run every container command line through the installed
``rmqstore`` CLI, so that chart and CLI cannot drift apart. The Dockerfile is checked as
text: there is no Docker engine here.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import json
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from packaging.specifiers import SpecifierSet

from rmqstore.cli import query_tools, writer_tools
from rmqstore.cli.main import build_parser
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.files.store import StoreSizes
from rmqstore.common.telemetry import tracing_requested
from rmqstore.query import node as query_node
from rmqstore.query.service import SERVICE_NAME as QUERY_SERVICE
from rmqstore.service.metrics import metrics_requested
from rmqstore.writer import node as writer_node
from rmqstore.writer.service import SERVICE_NAME as WRITER_SERVICE

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "rmqstore"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
RELEASE = "demo"
NAMESPACE = "rmq"
FULLNAME = f"{RELEASE}-rmqstore"
WRITER = f"{FULLNAME}-writer"
QUERY = f"{FULLNAME}-query"

# The Kubernetes versions every rendered object is validated against, with the API schemas
# kubernetes-validate ships (strict: unknown fields are errors): the chart's floor
# (Chart.yaml kubeVersion >=1.27, where gRPC probes are GA) and a current release.
KUBE_VERSIONS = ("1.27", "1.33")

# What the writer's stop may take beyond its gRPC grace: the final flush (msync of the dirty
# pages of the commit log, consume queues and index files), the checkpoint, the progress.
FINAL_FLUSH_BUDGET_S = 20

CUSTOM_STORE = {
    "flush": "sync",
    "flushIntervalMs": 200,
    "retentionHours": 0.5,
    "diskCleanRatio": 0.6,
    "diskFullRatio": 0.85,
    "autoCreateTopics": False,
    "maxTopics": 300,
    "maxQueues": 2400,
    "maxGroups": 50,
    "largeAnswerRate": 0,
    "storeHost": "10.1.2.3:10911",
    "sizes": {"commitlogFileSizeBytes": 65536, "cqFileUnits": 1000, "indexSlots": 512, "indexEntries": 2048},
}
EVERYTHING = {
    "store": CUSTOM_STORE,
    "persistence": {"storageClass": "fast", "size": "500Gi", "mountPath": "/var/lib/rmqstore"},
    "otel": {
        "enabled": True,
        "endpoint": "http://otel-collector.observability:4317",
        "serviceName": {"writer": "orders-writer", "query": "orders-query"},
        "sampler": "traceidratio",
        "samplerArg": "0.25",
        "resourceAttributes": {"deployment.environment": "prod"},
    },
    "tls": {"enabled": True, "secretName": "rmqstore-tls", "clientAuth": True, "mountPath": "/run/tls/"},
    "writer": {
        "port": 9876, "healthPort": 9886, "metricsPort": 9101, "extraEnv": [{"name": "TZ", "value": "UTC"}],
        "podDisruptionBudget": {"enabled": True}, "podAnnotations": {"team": "orders"},
    },
    "query": {"port": 9877, "metricsPort": 9102, "replicas": 5, "service": {"headless": True}},
    "metrics": {"prometheus": {"enabled": True}},
    "image": {"repository": "registry.example/rmqstore", "digest": "sha256:" + "ab" * 32},
}

# Values per rendering: the defaults, each mode, and each with every option turned on.
# The defaults leave access open to no choice: each rendering makes one (insecureOpen, an
# ACL from a Secret, or mutual TLS).
OPEN = {"insecureOpen": True}
ACL_SECRET = {"acl": {"secretName": "rmqstore-acl", "mountPath": "/run/acl/"}}
RENDERINGS: dict[str, dict[str, Any]] = {
    "defaults": OPEN,
    "sidecar": {"mode": "sidecar", **OPEN},
    "shared": {"mode": "shared", **ACL_SECRET},
    "shared-autoscaled": {"mode": "shared", "query": {"autoscaling": {"enabled": True}}, **OPEN},
    "sidecar-metrics": {"mode": "sidecar", "metrics": {"prometheus": {"enabled": True}}, **OPEN},
    "sidecar-tls": {"mode": "sidecar", "tls": {"enabled": True, "secretName": "rmqstore-tls"}, **ACL_SECRET},
    "sidecar-everything": {"mode": "sidecar", **EVERYTHING, **ACL_SECRET},
    "shared-everything": {"mode": "shared", **EVERYTHING},
}


# kubernetes_validate reads and parses its schema files (the definitions are megabytes of
# JSON) on every call; they do not change during a run, so each is parsed once.
kubernetes_validate.utils.schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)


@dataclass(frozen=True)
class Rendering:
    values: dict[str, Any]
    objects: list[dict[str, Any]]
    notes: str

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.kinds(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
        return found[0]

    def workloads(self) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] in ("StatefulSet", "Deployment")]

    def containers(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """(workload, container) for every container of every pod template."""
        for workload in self.workloads():
            for container in workload["spec"]["template"]["spec"]["containers"]:
                yield workload, container


@pytest.fixture(scope="session")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm.Chart, values: dict[str, Any]) -> Rendering:
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    objects: list[dict[str, Any]] = []
    notes = ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects.extend(document for document in yaml.load_all(text, Loader=yaml.CSafeLoader) if document)
    return Rendering(values, objects, notes)


@pytest.fixture(scope="session")
def renderings(chart: helm.Chart) -> dict[str, Rendering]:
    return {name: render(chart, values) for name, values in RENDERINGS.items()}


@pytest.fixture(params=sorted(RENDERINGS))
def rendering(request: pytest.FixtureRequest, renderings: dict[str, Rendering]) -> Rendering:
    return renderings[request.param]


def is_shared(rendering: Rendering) -> bool:
    return rendering.values.get("mode") == "shared"


def value(rendering: Rendering, *path: str) -> Any:
    """A value the rendering set explicitly, or None."""
    node: Any = rendering.values
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def volumes_of(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}
    for claim in workload["spec"].get("volumeClaimTemplates", []):
        volumes[claim["metadata"]["name"]] = {"name": claim["metadata"]["name"], "claimTemplate": claim}
    return volumes


def subset(labels: dict[str, str], of: dict[str, str]) -> bool:
    return all(of.get(key) == value for key, value in labels.items())


# Lint


@pytest.mark.parametrize("name", sorted(RENDERINGS))
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_chart_lints_clean(name: str, kube_version: str) -> None:
    report = helm.lint(CHART, RENDERINGS[name], strict=True, kube_version=f"v{kube_version}.0")
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); 2 is a warning, 3 an error.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


# What is rendered


def test_kinds_and_names(rendering: Rendering) -> None:
    rendered = {(o["kind"], o["metadata"]["name"]) for o in rendering.objects}
    expected = {
        ("ServiceAccount", FULLNAME),
        ("StatefulSet", WRITER),
        ("Service", WRITER),
        ("Service", QUERY),
    }
    if is_shared(rendering):
        expected |= {("Deployment", QUERY), ("PodDisruptionBudget", QUERY)}
        if value(rendering, "query", "autoscaling", "enabled"):
            expected.add(("HorizontalPodAutoscaler", QUERY))
    if value(rendering, "writer", "podDisruptionBudget", "enabled"):
        expected.add(("PodDisruptionBudget", WRITER))
    assert rendered == expected
    assert len(rendering.objects) == len(rendered), "an object is rendered twice"


def test_writer_is_one_statefulset_replica_with_a_claim_template(rendering: Rendering) -> None:
    writer = rendering.one("StatefulSet", WRITER)
    spec = writer["spec"]
    assert spec["replicas"] == 1
    headless = rendering.one("Service", spec["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    (claim,) = spec["volumeClaimTemplates"]
    persistence = {"size": "20Gi", "storageClass": "", **rendering.values.get("persistence", {})}
    assert claim["spec"]["resources"]["requests"]["storage"] == persistence["size"]
    assert claim["spec"]["accessModes"] == (["ReadWriteMany"] if is_shared(rendering) else ["ReadWriteOnce"])
    if persistence["storageClass"]:
        assert claim["spec"]["storageClassName"] == persistence["storageClass"]
    else:
        assert "storageClassName" not in claim["spec"]
    # Deleting the release never deletes the store.
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    names = [c["name"] for c in spec["template"]["spec"]["containers"]]
    assert names == (["writer"] if is_shared(rendering) else ["writer", "query"])


def test_query_nodes_are_a_deployment_in_shared_mode(rendering: Rendering) -> None:
    if not is_shared(rendering):
        assert rendering.kinds("Deployment") == []
        assert rendering.kinds("HorizontalPodAutoscaler") == []
        return
    deployment = rendering.one("Deployment", QUERY)
    autoscaled = rendering.kinds("HorizontalPodAutoscaler")
    if autoscaled:
        # The HPA owns the replica count: a rendered one would fight it on every upgrade.
        assert "replicas" not in deployment["spec"]
        (hpa,) = autoscaled
        target = hpa["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", QUERY)
        assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    else:
        assert deployment["spec"]["replicas"] == (value(rendering, "query", "replicas") or 2)
    assert [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]] == ["query"]


def test_query_service_is_headless_on_request(rendering: Rendering) -> None:
    service = rendering.one("Service", QUERY)["spec"]
    if value(rendering, "query", "service", "headless"):
        assert (service["type"], service["clusterIP"]) == ("ClusterIP", "None")
    else:
        assert "clusterIP" not in service


def test_labels_match_selectors(rendering: Rendering) -> None:
    pods = {w["metadata"]["name"]: w["spec"]["template"] for w in rendering.workloads()}
    for workload in rendering.workloads():
        selector = workload["spec"]["selector"]["matchLabels"]
        assert subset(selector, workload["spec"]["template"]["metadata"]["labels"]), workload["metadata"]["name"]
        # Selectors must not move with a chart upgrade: no version labels in them.
        assert set(selector) == {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"}
    for obj in rendering.objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "rmqstore"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
    for service in rendering.kinds("Service"):
        selected = [name for name, pod in pods.items() if subset(service["spec"]["selector"], pod["metadata"]["labels"])]
        assert len(selected) == 1, f"Service {service['metadata']['name']} selects {selected}"
        pod = pods[selected[0]]
        port_names = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names
    # The query Service reaches query containers, whichever pod they live in.
    query_service = rendering.one("Service", QUERY)
    (target,) = [p for p in pods.values() if subset(query_service["spec"]["selector"], p["metadata"]["labels"])]
    assert "query" in [c["name"] for c in target["spec"]["containers"]]
    for budget in rendering.kinds("PodDisruptionBudget"):
        selector = budget["spec"]["selector"]["matchLabels"]
        assert [n for n, p in pods.items() if subset(selector, p["metadata"]["labels"])] == [budget["metadata"]["name"]]


def tls_enabled(rendering: Rendering) -> bool:
    return bool(value(rendering, "tls", "enabled"))


def test_grpc_probes_against_the_health_service(rendering: Rendering) -> None:
    services = {"writer": WRITER_SERVICE, "query": QUERY_SERVICE}
    defaults = {"writer": (10911, 10921), "query": (10912, 10922)}
    for _, container in rendering.containers():
        name = container["name"]
        # The metrics port is test_prometheus_endpoint_ports_and_scrape_annotations' business.
        ports = {p["name"]: p["containerPort"] for p in container["ports"] if p["name"] != f"metrics-{name}"}
        grpc_port = value(rendering, name, "port") or defaults[name][0]
        assert ports[f"grpc-{name}"] == grpc_port
        if tls_enabled(rendering):
            # Kubernetes' gRPC probes cannot speak TLS: they ask the plaintext health port.
            health_port = value(rendering, name, "healthPort") or defaults[name][1]
            assert ports == {f"grpc-{name}": grpc_port, f"health-{name}": health_port}
            probe_port = health_port
        else:
            assert ports == {f"grpc-{name}": grpc_port}
            probe_port = grpc_port
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container[kind]
            assert set(probe) - {"periodSeconds", "timeoutSeconds", "failureThreshold"} == {"grpc"}, kind
            assert probe["grpc"]["port"] == probe_port
        # Startup and readiness ask for the node's own service, which turns NOT_SERVING when
        # a graceful stop begins; liveness asks for the server as a whole ("").
        assert container["startupProbe"]["grpc"]["service"] == services[container["name"]]
        assert container["readinessProbe"]["grpc"]["service"] == services[container["name"]]
        assert container["livenessProbe"]["grpc"].get("service", "") == ""


def test_query_containers_mount_the_store_read_only(rendering: Rendering) -> None:
    query_containers = [(w, c) for w, c in rendering.containers() if c["name"] == "query"]
    assert query_containers, "no query container rendered"
    for workload, container in query_containers:
        volumes = volumes_of(workload)
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "emptyDir" in volume:
                continue  # /tmp: the only writable path
            assert mount.get("readOnly") is True, f"{mount['name']} is writable in a query container"
        store_mounts = [m for m in container["volumeMounts"] if m["name"] == "data"]
        assert len(store_mounts) == 1
    if is_shared(rendering):
        writer = rendering.one("StatefulSet", WRITER)
        template = writer["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
        claim = rendering.one("Deployment", QUERY)["spec"]["template"]["spec"]["volumes"][0]
        # The name Kubernetes gives the writer's claim: <template>-<statefulset>-<ordinal>.
        assert claim["persistentVolumeClaim"] == {"claimName": f"{template}-{WRITER}-0", "readOnly": True}
    writer_container = next(c for _, c in rendering.containers() if c["name"] == "writer")
    assert not next(m for m in writer_container["volumeMounts"] if m["name"] == "data").get("readOnly", False)


def test_security_context(rendering: Rendering) -> None:
    for workload in rendering.workloads():
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["automountServiceAccountToken"] is False
        assert "hostNetwork" not in pod and "hostPID" not in pod
    for _, container in rendering.containers():
        context = container["securityContext"]
        assert context["runAsNonRoot"] is True
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["privileged"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        assert "add" not in context["capabilities"]


def test_grace_period_outlasts_the_writers_stop(rendering: Rendering) -> None:
    writer = rendering.one("StatefulSet", WRITER)["spec"]["template"]["spec"]
    assert writer["terminationGracePeriodSeconds"] >= writer_node.WriterNode.KIND.shutdown_grace_s + FINAL_FLUSH_BUDGET_S
    for deployment in rendering.kinds("Deployment"):
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > query_node.QueryNode.KIND.shutdown_grace_s


def test_resources_are_set(rendering: Rendering) -> None:
    for _, container in rendering.containers():
        assert container["resources"]["requests"]["cpu"]
        assert container["resources"]["requests"]["memory"]
        assert container["resources"]["limits"]["memory"]


# Values


BAD_VALUES = {
    "negative replicas": ({"mode": "shared", "query": {"replicas": -1}}, "/query/replicas"),
    "unknown flush policy": ({"store": {"flush": "fsync"}}, "/store/flush"),
    "missing storage size": ({"persistence": {"size": None}}, "size"),
    "empty storage size": ({"persistence": {"size": ""}}, "/persistence/size"),
    "storage size not a quantity": ({"persistence": {"size": "20 gigs"}}, "/persistence/size"),
    "unknown mode": ({"mode": "daemonset"}, "/mode"),
    "shared mode on a ReadWriteOnce claim": ({"mode": "shared", "persistence": {"accessMode": "ReadWriteOnce"}}, "accessMode"),
    "grace shorter than the final flush": ({"writer": {"terminationGracePeriodSeconds": 5}}, "/writer/terminationGracePeriodSeconds"),
    "disk ratio above 1": ({"store": {"diskFullRatio": 1.5}}, "/store/diskFullRatio"),
    "size not an integer": ({"store": {"sizes": {"cqFileUnits": 1.5}}}, "/store/sizes/cqFileUnits"),
    "commit log file below the library's minimum": ({"store": {"sizes": {"commitlogFileSizeBytes": 512}}}, "commitlogFileSizeBytes"),
    "store host without a port": ({"store": {"storeHost": "10.0.0.1"}}, "/store/storeHost"),
    "no topics allowed": ({"store": {"maxTopics": 0}}, "/store/maxTopics"),
    "fractional queue cap": ({"store": {"maxQueues": 1.5}}, "/store/maxQueues"),
    "negative large answer rate": ({"store": {"largeAnswerRate": -1}}, "/store/largeAnswerRate"),
    "root user": ({"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot"),
    "writable root file system": ({"securityContext": {"readOnlyRootFilesystem": False}}, "readOnlyRootFilesystem"),
    "added capability": ({"securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}, "/securityContext/capabilities/add"),
    "exporter rmqstore lacks": ({"otel": {"enabled": True, "tracesExporter": "jaeger"}}, "/otel/tracesExporter"),
    "unknown sampler": ({"otel": {"sampler": "sometimes"}}, "/otel/sampler"),
    "TLS without a secret": ({"tls": {"enabled": True}}, "/tls/secretName"),
    "port out of range": ({"writer": {"port": 70000}}, "/writer/port"),
    "health port out of range": ({"query": {"healthPort": 0}}, "/query/healthPort"),
    "metrics port out of range": ({"writer": {"metricsPort": 65536}}, "/writer/metricsPort"),
    "metrics switch not a boolean": ({"metrics": {"prometheus": {"enabled": "yes"}}}, "/metrics/prometheus/enabled"),
    "client auth not a boolean": ({"tls": {"clientAuth": "yes"}}, "/tls/clientAuth"),
    "headless Service of another type": ({"query": {"service": {"headless": True, "type": "NodePort"}}}, "/query/service/type"),
    "misspelt key": ({"query": {"replica": 3}}, "replica"),
    "unknown top-level key": ({"replicas": 3}, "replicas"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_schema_refuses_bad_values(chart: helm.Chart, case: str) -> None:
    values, where = BAD_VALUES[case]
    with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    report = helm.lint(CHART, values)
    assert any(where in error for error in report["errors"]), report["errors"]


BAD_COMBINATIONS = {
    "clean ratio above full ratio": ({"store": {"diskCleanRatio": 0.95, "diskFullRatio": 0.9}}, "diskCleanRatio"),
    "writer and query on one port": ({"query": {"port": 10911}}, "must differ"),
    "health port on a gRPC port": (
        {"tls": {"enabled": True, "secretName": "s"}, "query": {"healthPort": 10911}},
        "healthPort must all differ",
    ),
    "two health ports alike": (
        {"tls": {"enabled": True, "secretName": "s"}, "writer": {"healthPort": 10922}},
        "healthPort must all differ",
    ),
    "metrics port on a gRPC port": (
        {"metrics": {"prometheus": {"enabled": True}}, "query": {"metricsPort": 10911}},
        "metricsPort must differ",
    ),
    "metrics port on a health port": (
        {"metrics": {"prometheus": {"enabled": True}}, "tls": {"enabled": True, "secretName": "s"}, "writer": {"metricsPort": 10922}},
        "metricsPort must differ",
    ),
    "two metrics ports alike": (
        {"metrics": {"prometheus": {"enabled": True}}, "query": {"metricsPort": 9464}},
        "metricsPort must differ",
    ),
    "autoscaling minimum above maximum": (
        {"mode": "shared", "query": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}},
        "minReplicas",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_COMBINATIONS))
def test_chart_refuses_inconsistent_values(chart: helm.Chart, case: str) -> None:
    values, message = BAD_COMBINATIONS[case]
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render({**OPEN, **values}, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize(
    "values",
    [{}, {"tls": {"enabled": True, "secretName": "s"}}, {"tls": {"enabled": False, "clientAuth": True}}],
    ids=["defaults", "tls-without-client-auth", "client-auth-without-tls"],
)
def test_chart_refuses_nodes_open_to_anyone_unless_asked(chart: helm.Chart, values: dict[str, Any]) -> None:
    """Listening on every pod address needs an ACL, mutual TLS, or insecureOpen said out loud."""
    with pytest.raises(helm.HelmRenderError, match=re.escape("set acl.secretName (an ACL), tls.clientAuth (mutual TLS) or insecureOpen: true")):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_access_flags_and_the_acl_secret(rendering: Rendering) -> None:
    """An ACL Secret is mounted read-only in every rmqstore container (its acl.yaml key
    only, not group- or world-readable) and given as --acl; insecureOpen gives
    --insecure-open; mutual TLS alone gives neither."""
    acl_secret = value(rendering, "acl", "secretName")
    for workload, container in rendering.containers():
        args = container["args"]
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        volumes = volumes_of(workload)
        if acl_secret:
            directory = value(rendering, "acl", "mountPath").rstrip("/")
            assert args[args.index("--acl") + 1] == f"{directory}/acl.yaml"
            assert "--insecure-open" not in args
            assert mounts["acl"]["readOnly"] is True and mounts["acl"]["mountPath"] == value(rendering, "acl", "mountPath")
            assert volumes["acl"]["secret"] == {
                "secretName": acl_secret,
                "defaultMode": 0o440,
                "items": [{"key": "acl.yaml", "path": "acl.yaml"}],
            }
        else:
            assert "--acl" not in args and "acl" not in mounts and "acl" not in volumes
            assert ("--insecure-open" in args) == bool(value(rendering, "insecureOpen"))


def test_schema_accepts_the_defaults_and_every_rendering(chart: helm.Chart) -> None:
    for values in RENDERINGS.values():
        chart.validate_schema(chart.merge_values(values))


# Kubernetes API schemas


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_object_validates_against_the_kubernetes_api(rendering: Rendering, kube_version: str) -> None:
    for obj in rendering.objects:
        try:
            used = kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {kube_version}: {error.message}")
        assert used == kube_version


# The chart against the CLI


def rmqstore_command() -> list[str]:
    """The installed rmqstore entry point, beside the interpreter running the tests."""
    script = Path(sys.executable).with_name("rmqstore")
    assert script.exists(), f"the rmqstore console script is not installed beside {sys.executable}"
    return [str(script)]


@functools.cache
def _parser() -> Any:
    return build_parser()


def parse_cli(argv: list[str]) -> Any:
    """Parse a command line with the real rmqstore parser, failing the test on refusal."""
    try:
        return _parser().parse_args(argv)
    except SystemExit as stop:
        pytest.fail(f"rmqstore refuses {shlex.join(argv)} (exit {stop.code})")


@pytest.mark.slow
def test_container_command_lines_are_accepted_by_the_cli(rendering: Rendering) -> None:
    parsed: dict[str, Any] = {}
    for _workload, container in rendering.containers():
        assert container["command"] == ["rmqstore"]
        argv = container["args"]
        # The installed CLI runs the command line, with --help so that no server starts;
        # argparse stops at --help before it reports unknown options, so every option of
        # the line must also appear in that help.
        shown = subprocess.run(
            [*rmqstore_command(), *argv, "--help"], capture_output=True, text=True, timeout=60, check=False
        )
        assert shown.returncode == 0, shown.stderr
        for option in (a for a in argv if a.startswith("--")):
            assert re.search(rf"(^|\s){re.escape(option)}(\s|,|$)", shown.stdout, re.M), f"{option} not in help"
        # ... and the real parser accepts the whole line with its values.
        args = parse_cli(argv)
        expected = {"writer": writer_tools.cmd_writer_serve, "query": query_tools.cmd_query_serve}[container["name"]]
        assert args.handler is expected
        assert args.host == "0.0.0.0"
        assert args.port == container["ports"][0]["containerPort"]
        data = next(m for m in container["volumeMounts"] if m["name"] == "data")
        assert Path(args.store).parent == Path(data["mountPath"])
        # Values the parser takes as they come, but the store library checks.
        StoreSizes(args.commitlog_file_size, args.cq_file_units, args.index_slots, args.index_entries)
        if container["name"] == "writer" and args.store_host:
            SocketAddress.parse(args.store_host)
        # TLS: the files of the mounted kubernetes.io/tls Secret, and the probes' health port.
        if tls_enabled(rendering):
            tls_mount = Path(next(m for m in container["volumeMounts"] if m["name"] == "tls")["mountPath"])
            assert (Path(args.tls_cert), Path(args.tls_key)) == (tls_mount / "tls.crt", tls_mount / "tls.key")
            client_auth = value(rendering, "tls", "clientAuth")
            assert args.tls_client_ca == (str(tls_mount / "ca.crt") if client_auth else None)
            health = next(p for p in container["ports"] if p["name"] == f"health-{container['name']}")
            assert args.health_port == health["containerPort"] == container["livenessProbe"]["grpc"]["port"]
        else:
            assert (args.tls_cert, args.tls_key, args.tls_client_ca, args.health_port) == (None, None, None, None)
        parsed[container["name"]] = args
    # Writer and query nodes must agree on the store's sizes (README, "Sizes").
    size_options = ("store", "commitlog_file_size", "cq_file_units", "index_slots", "index_entries")
    assert {k: getattr(parsed["writer"], k) for k in size_options} == {k: getattr(parsed["query"], k) for k in size_options}


def test_store_values_reach_the_writers_command_line(chart: helm.Chart) -> None:
    rendering = render(chart, {**OPEN, "store": CUSTOM_STORE, "persistence": {"mountPath": "/srv/rmq"}})
    writer = next(c for _, c in rendering.containers() if c["name"] == "writer")
    args = parse_cli(writer["args"])
    assert args.store == "/srv/rmq/store"
    assert args.flush == "sync"
    assert args.flush_interval_ms == 200
    assert args.retention_hours == 0.5
    assert (args.disk_clean_ratio, args.disk_full_ratio) == (0.6, 0.85)
    assert args.no_auto_create is True
    assert (args.max_topics, args.max_queues, args.max_groups) == (300, 2400, 50)
    assert args.large_answer_rate == 0
    assert args.store_host == "10.1.2.3:10911"
    sizes = CUSTOM_STORE["sizes"]
    assert (args.commitlog_file_size, args.cq_file_units, args.index_slots, args.index_entries) == (
        sizes["commitlogFileSizeBytes"],
        sizes["cqFileUnits"],
        sizes["indexSlots"],
        sizes["indexEntries"],
    )


def test_writer_advertises_its_service_to_rocketmq5_clients(chart: helm.Chart) -> None:
    """QueryRoute hands RocketMQ 5 clients the writer's Service by default, or the value given."""
    from rmqstore.writer.rocketmq5 import RouteConfig

    writer = next(c for _, c in render(chart, OPEN).containers() if c["name"] == "writer")
    args = parse_cli(writer["args"])
    assert args.advertise == f"{RELEASE}-rmqstore-writer.{NAMESPACE}.svc:10911"
    assert args.broker_name == "rmqstore-0"
    RouteConfig.parse(args.advertise, args.broker_name)
    custom = render(chart, {"writer": {"advertise": "mq.example.com:443", "brokerName": "east-1"}, **OPEN})
    args = parse_cli(next(c for _, c in custom.containers() if c["name"] == "writer")["args"])
    assert (args.advertise, args.broker_name) == ("mq.example.com:443", "east-1")
    # The query nodes report the writer's broker name in consumerProgress.
    for rendered, name in ((render(chart, OPEN), "rmqstore-0"), (custom, "east-1")):
        query = next(c for _, c in rendered.containers() if c["name"] == "query")
        assert parse_cli(query["args"]).broker_name == name


def test_default_command_lines_use_rocketmqs_sizes_without_float_notation(chart: helm.Chart) -> None:
    rendering = render(chart, OPEN)
    writer = next(c for _, c in rendering.containers() if c["name"] == "writer")
    # Helm holds numbers as float64: 1073741824 must not come out as 1.073741824e+09.
    assert all("e+" not in arg for arg in writer["args"])
    args = parse_cli(writer["args"])
    assert StoreSizes(args.commitlog_file_size, args.cq_file_units, args.index_slots, args.index_entries) == StoreSizes()
    assert (args.flush, args.no_auto_create, args.store_host) == ("async", False, None)
    # The caps are the writer's own defaults.
    assert (args.max_topics, args.max_queues, args.max_groups) == (10_000, 100_000, 1_000)
    assert args.large_answer_rate == 64


# OpenTelemetry and TLS


def test_otel_settings_come_from_values(rendering: Rendering) -> None:
    otel = rendering.values.get("otel", {})
    for _, container in rendering.containers():
        env = env_of(container)
        if not otel.get("enabled"):
            metrics_only = ["OTEL_METRICS_EXPORTER"] if prometheus_enabled(rendering) else []
            assert [name for name in env if name.startswith("OTEL_")] == metrics_only
            assert tracing_requested(env) is None
            continue
        assert tracing_requested(env) == "otlp"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == otel["endpoint"]
        assert env["OTEL_SERVICE_NAME"] == otel["serviceName"][container["name"]]
        assert env["OTEL_TRACES_SAMPLER"] == otel["sampler"]
        assert env["OTEL_TRACES_SAMPLER_ARG"] == otel["samplerArg"]
        attributes = dict(pair.split("=", 1) for pair in env["OTEL_RESOURCE_ATTRIBUTES"].split(","))
        assert attributes["k8s.pod.name"] == "$(POD_NAME)"
        assert attributes["deployment.environment"] == "prod"
        # $(POD_NAME) expands only if POD_NAME is defined before it.
        names = [e["name"] for e in container["env"]]
        assert names.index("POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES")


def prometheus_enabled(rendering: Rendering) -> bool:
    return bool(rendering.values.get("metrics", {}).get("prometheus", {}).get("enabled"))


def test_prometheus_endpoint_ports_and_scrape_annotations(rendering: Rendering) -> None:
    """With metrics.prometheus.enabled every node serves its scrape endpoint on its
    metricsPort (flag, environment and a named container port agree) and each pod's
    annotations name the port of the node it is for: the writer's in the writer's pod
    (sidecar mode included), the query node's in a shared-mode query pod. Off, none of it."""
    enabled = prometheus_enabled(rendering)
    ports = {"writer": value(rendering, "writer", "metricsPort") or 9464, "query": value(rendering, "query", "metricsPort") or 9465}
    for workload, container in rendering.containers():
        env = env_of(container)
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        pairs = dict(itertools.pairwise(container["args"]))
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        if not enabled:
            assert "--metrics-port" not in container["args"] and f"metrics-{container['name']}" not in named
            assert not [key for key in annotations if key.startswith("prometheus.io/")]
            assert metrics_requested(env) == ("otlp" if rendering.values.get("otel", {}).get("enabled") else None)
            continue
        port = ports[container["name"]]
        assert named[f"metrics-{container['name']}"] == port and int(pairs["--metrics-port"]) == port
        assert pairs["--host"] == "0.0.0.0"  # the endpoint binds where the gRPC port does: the pod's addresses
        assert metrics_requested(env) == "prometheus"
        pod_node = "writer" if workload["kind"] == "StatefulSet" else "query"
        assert {k: v for k, v in annotations.items() if k.startswith("prometheus.io/")} == {
            "prometheus.io/scrape": "true", "prometheus.io/port": str(ports[pod_node]), "prometheus.io/path": "/metrics",
        }  # fmt: skip
        if workload["kind"] == "StatefulSet":
            assert annotations.items() >= (value(rendering, "writer", "podAnnotations") or {}).items()


SAMPLER_DESCRIPTIONS = {
    "always_on": "AlwaysOnSampler",
    "always_off": "AlwaysOffSampler",
    "traceidratio": "TraceIdRatioBased{0.1}",
    "parentbased_always_on": "ParentBased{root:AlwaysOnSampler,",
    "parentbased_always_off": "ParentBased{root:AlwaysOffSampler,",
    "parentbased_traceidratio": "ParentBased{root:TraceIdRatioBased{0.1},",
}


def test_every_sampler_the_schema_allows_is_one_the_sdk_knows(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    schema = json.loads((CHART / "values.schema.json").read_text())
    allowed = schema["properties"]["otel"]["properties"]["sampler"]["enum"]
    assert sorted(allowed) == sorted(SAMPLER_DESCRIPTIONS)
    for sampler in allowed:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.1")
        assert TracerProvider().sampler.get_description().startswith(SAMPLER_DESCRIPTIONS[sampler])


def test_tls_secret_is_mounted_read_only_and_served(rendering: Rendering) -> None:
    tls = rendering.values.get("tls", {})
    for workload, container in rendering.containers():
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        args = container["args"]
        if not tls.get("enabled"):
            assert "tls" not in mounts
            assert not [a for a in args if "tls" in a.lower() or a == "--health-port"]
            continue
        assert mounts["tls"]["readOnly"] is True
        directory = tls.get("mountPath", "/etc/rmqstore/tls").rstrip("/")
        assert mounts["tls"]["mountPath"] == tls.get("mountPath", "/etc/rmqstore/tls")
        assert volumes_of(workload)["tls"]["secret"]["secretName"] == tls["secretName"]
        pairs = dict(itertools.pairwise(args))
        assert pairs["--tls-cert"] == f"{directory}/tls.crt"
        assert pairs["--tls-key"] == f"{directory}/tls.key"
        if tls.get("clientAuth"):
            assert pairs["--tls-client-ca"] == f"{directory}/ca.crt"
        else:
            assert "--tls-client-ca" not in args
        assert int(pairs["--health-port"]) == container["readinessProbe"]["grpc"]["port"]
    if tls.get("enabled"):
        assert "speak TLS only" in rendering.notes
        assert "no TLS options" not in rendering.notes
        assert "grpcurl -plaintext" not in rendering.notes
    else:
        assert "plaintext gRPC" in rendering.notes
        assert "--tls-" not in rendering.notes


# NOTES.txt


def test_notes_tell_how_to_reach_and_query_the_service(rendering: Rendering) -> None:
    notes = rendering.notes
    ports = {
        "writer": value(rendering, "writer", "port") or 10911,
        "query": value(rendering, "query", "port") or 10912,
    }
    assert f"{WRITER}.{NAMESPACE}.svc.cluster.local:{ports['writer']}" in notes
    assert f"{QUERY}.{NAMESPACE}.svc.cluster.local:{ports['query']}" in notes
    assert f"port-forward service/{QUERY} {ports['query']}:{ports['query']}" in notes
    # The example command lines: indented, as NOTES.txt prints commands to copy.
    commands = [line.strip() for line in notes.splitlines() if line.startswith("  rmqstore ")]
    commands += [line.split(" -- ", 1)[1] for line in notes.splitlines() if "exec" in line and " -- rmqstore " in line]
    used = {shlex.split(c)[1] for c in commands}
    assert {"send", "queryMsgByKey", "queryMsgByUniqueKey", "inspect"} <= used
    for command in commands:
        argv = shlex.split(command)[1:]
        args = parse_cli(argv)
        endpoint = getattr(args, "endpoint", None)
        if endpoint:
            # With TLS the examples connect with TLS, and with client auth present a certificate.
            assert (args.tls_ca is not None) == tls_enabled(rendering)
            assert (args.tls_client_cert is not None) == bool(tls_enabled(rendering) and value(rendering, "tls", "clientAuth"))
            expected = ports["writer"] if argv[0] == "send" else ports["query"]
            assert endpoint == f"127.0.0.1:{expected}"


# The image


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def dockerfile_stages() -> list[list[Instruction]]:
    """The Dockerfile's instructions, continuation lines joined, split into stages; the
    instructions before the first FROM (global ARGs) are stage 0."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[list[Instruction]] = [[]]
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, arguments = line.partition(" ")
        instruction = Instruction(keyword.upper(), " ".join(arguments.split()))
        if instruction.keyword == "FROM":
            stages.append([])
        stages[-1].append(instruction)
    return stages


def global_args() -> dict[str, str]:
    args = {}
    for instruction in dockerfile_stages()[0]:
        assert instruction.keyword == "ARG"
        name, _, default = instruction.arguments.partition("=")
        args[name] = default
    return args


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_dockerfile_base_is_a_pinned_slim_python() -> None:
    stages = dockerfile_stages()[1:]
    assert len(stages) >= 2, "a build stage and a runtime stage"
    bases = set()
    for stage in stages:
        image = stage[0].arguments.split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: global_args()[m.group(1)], image)
        bases.add(image)
    (base,) = bases  # one base for every stage: the virtualenv moves between them
    match = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base)
    assert match, f"{base}: pin python:X.Y.Z-slim-<debian release>"
    python = f"{match.group(1)}.{match.group(2)}.{match.group(3)}"
    assert python in SpecifierSet(pyproject()["project"]["requires-python"])


def test_dockerfile_runs_as_the_charts_non_root_user(chart: helm.Chart) -> None:
    runtime = dockerfile_stages()[-1]
    users = [i.arguments for i in runtime if i.keyword == "USER"]
    assert users, "the runtime stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    # Numeric, so that the kubelet can check runAsNonRoot without reading /etc/passwd.
    assert uid.isdigit() and gid.isdigit() and int(uid) > 0 and int(gid) > 0
    context = chart.values["podSecurityContext"]
    assert (int(uid), int(gid)) == (context["runAsUser"], context["runAsGroup"])
    assert any(f"--uid {uid}" in i.arguments for i in runtime if i.keyword == "RUN")


def test_dockerfile_entry_point_is_the_rmqstore_command() -> None:
    runtime = dockerfile_stages()[-1]
    (entrypoint,) = [json.loads(i.arguments) for i in runtime if i.keyword == "ENTRYPOINT"]
    assert entrypoint == ["rmqstore"]
    target = pyproject()["project"]["scripts"][entrypoint[0]]
    module, _, function = target.partition(":")
    assert callable(getattr(importlib.import_module(module), function))
    assert any(i.keyword == "ENV" and "PATH=/opt/venv/bin:" in i.arguments for i in runtime)


def test_dockerfile_runtime_stage_has_no_build_tools() -> None:
    runtime = dockerfile_stages()[-1]
    commands = " ".join(i.arguments for i in runtime if i.keyword == "RUN")
    for tool in ("apt-get install", "pip install", "gcc", "build-essential", "grpcio-tools", "setup.py"):
        assert tool not in commands
    copies = [i.arguments for i in runtime if i.keyword in ("COPY", "ADD")]
    assert copies == ["--from=build /opt/venv /opt/venv"]


def test_dockerfile_copies_every_package_and_dockerignore_admits_only_that() -> None:
    build = dockerfile_stages()[1]
    # COPY SOURCE... DESTINATION, from the build context (no --from).
    copied = {source for i in build if i.keyword == "COPY" for source in i.arguments.split()[:-1]}
    assert not [source for source in copied if source.startswith("--")]
    package_dirs = {d.split("/")[0] for d in pyproject()["tool"]["setuptools"]["package-dir"].values()}
    assert package_dirs <= copied, f"not copied into the image: {package_dirs - copied}"
    assert {"pyproject.toml", "setup.py", "README.md"} <= copied
    patterns = [p.strip() for p in DOCKERIGNORE.read_text().splitlines() if p.strip() and not p.startswith("#")]
    assert patterns[0] == "*", "exclude everything, then admit what the image needs"
    admitted = {p[1:] for p in patterns if p.startswith("!")}
    assert copied <= admitted
    assert not admitted & {".git", ".venv", "tests", "demo-store", "helm", ".ci"}


def test_dockerfile_build_stage_runs_the_smoke_check_on_the_installed_virtualenv() -> None:
    """The image's smoke step is CI's (.ci/smoke.py: nodes started, a message sent and
    found), run with the virtualenv that the runtime stage copies, once it is complete."""
    build = dockerfile_stages()[1]
    commands = [command.strip() for i in build if i.keyword == "RUN" for command in i.arguments.split("&&")]
    install = commands.index("/opt/venv/bin/pip install /src")
    smoke = commands.index("/opt/venv/bin/python /src/.ci/smoke.py /opt/venv/bin/rmqstore")
    assert install < commands.index("/opt/venv/bin/python -m pip uninstall --yes pip setuptools") < smoke
    assert "COPY .ci/smoke.py .ci/smoke.py" in [f"{i.keyword} {i.arguments}" for i in build]
    assert (ROOT / ".ci" / "smoke.py").is_file()


# Chart metadata


def test_chart_runs_this_release_of_rmqstore(chart: helm.Chart) -> None:
    assert chart.metadata["appVersion"] == pyproject()["project"]["version"]
    rendering = render(chart, OPEN)
    images = {c["image"] for _, c in rendering.containers()}
    assert images == {f"rmqstore:{pyproject()['project']['version']}"}
    pinned = render(chart, {**OPEN, "image": {"repository": "r/rmqstore", "digest": "sha256:" + "0" * 64}})
    assert {c["image"] for _, c in pinned.containers()} == {"r/rmqstore@sha256:" + "0" * 64}


# The web console (console.enabled)

CONSOLE = f"{FULLNAME}-console"
CONSOLE_RENDERINGS: dict[str, dict[str, Any]] = {
    "console-users": {"console": {"enabled": True, "usersSecret": "console-users"}, **OPEN},
    "console-no-auth-shared": {"mode": "shared", "console": {"enabled": True, "noAuth": True, "port": 9090}, **ACL_SECRET},
    "console-everything": {**EVERYTHING, "mode": "shared", "console": {"enabled": True, "usersSecret": "console-users", "replicas": 2}},
}


@pytest.fixture(scope="module", params=sorted(CONSOLE_RENDERINGS))
def console_rendering(request: pytest.FixtureRequest, chart: helm.Chart) -> Rendering:
    return render(chart, CONSOLE_RENDERINGS[request.param])


def test_console_is_off_by_default(rendering: Rendering) -> None:
    assert not any(o["metadata"]["name"] == CONSOLE for o in rendering.objects)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_console_renderings_lint_and_validate(console_rendering: Rendering, kube_version: str) -> None:
    report = helm.lint(CHART, console_rendering.values, strict=True, kube_version=f"v{kube_version}.0")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
    for obj in console_rendering.objects:
        assert kubernetes_validate.validate(obj, kube_version, strict=True) == kube_version


def test_console_deployment_is_non_root_read_only_with_http_probes(console_rendering: Rendering) -> None:
    deployment = console_rendering.one("Deployment", CONSOLE)
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == (value(console_rendering, "console", "replicas") or 1)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert (context["runAsNonRoot"], context["readOnlyRootFilesystem"], context["allowPrivilegeEscalation"]) == (True, True, False)
    assert context["capabilities"] == {"drop": ["ALL"]}
    port = value(console_rendering, "console", "port") or 8080
    assert container["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # Nothing of the store is mounted: the console reads through the query Service only.
    assert [m["name"] for m in container["volumeMounts"] if m["name"] == "data"] == []
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["name"] != "tmp")
    service = console_rendering.one("Service", CONSOLE)
    assert service["spec"]["ports"] == [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP", "appProtocol": "http"}]
    assert subset(service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert not subset(service["spec"]["selector"], console_rendering.one("Service", QUERY)["spec"]["selector"])


def test_console_command_line_is_accepted_by_the_cli(console_rendering: Rendering) -> None:
    from rmqstore.cli import console_tools

    container = console_rendering.one("Deployment", CONSOLE)["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["rmqstore"]
    args = parse_cli(container["args"])
    assert args.handler is console_tools.cmd_console
    query_port = value(console_rendering, "query", "port") or 10912
    writer_port = value(console_rendering, "writer", "port") or 10911
    assert args.query_endpoint == f"{QUERY}.{NAMESPACE}.svc:{query_port}"
    assert args.writer_endpoint == f"{WRITER}.{NAMESPACE}.svc:{writer_port}"
    assert (args.host, args.port) == ("0.0.0.0", container["ports"][0]["containerPort"])
    volumes = volumes_of(console_rendering.one("Deployment", CONSOLE))
    if value(console_rendering, "console", "usersSecret"):
        assert (args.users, args.no_auth) == ("/etc/rmqstore/console/users", False)
        assert volumes["users"]["secret"]["secretName"] == "console-users"
        assert volumes["users"]["secret"]["items"] == [{"key": "users", "path": "users"}]
    else:
        assert (args.users, args.no_auth) == (None, True)
    if tls_enabled(console_rendering):
        tls_mount = Path(next(m for m in container["volumeMounts"] if m["name"] == "tls")["mountPath"])
        assert args.tls_ca == str(tls_mount / "ca.crt")
        assert (args.tls_client_cert, args.tls_client_key) == (str(tls_mount / "tls.crt"), str(tls_mount / "tls.key"))
    else:
        assert (args.tls_ca, args.tls_client_cert) == (None, None)


def test_console_notes_tell_how_to_reach_it(console_rendering: Rendering) -> None:
    port = value(console_rendering, "console", "port") or 8080
    assert f"port-forward service/{CONSOLE} {port}:{port}" in console_rendering.notes
    assert f"open http://127.0.0.1:{port}/" in console_rendering.notes


@pytest.mark.parametrize(
    ("console", "message"),
    [
        ({"enabled": True}, "console.enabled needs console.usersSecret (a users file) or, behind something that authenticates, console.noAuth: true"),
        ({"enabled": True, "usersSecret": "u", "noAuth": True}, "console: give usersSecret or noAuth, not both"),
    ],
)
def test_chart_refuses_a_console_without_a_decision_on_auth(chart: helm.Chart, console: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render({"console": console, **OPEN}, name=RELEASE, namespace=NAMESPACE)


def test_schema_refuses_bad_console_values(chart: helm.Chart) -> None:
    for values, where in (
        ({"console": {"port": 0}}, "/console/port"),
        ({"console": {"noAuth": "yes"}}, "/console/noAuth"),
        ({"console": {"replica": 2}}, "replica"),
    ):
        with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
            chart.render(values, name=RELEASE, namespace=NAMESPACE)


# Writer groups (docs/replication.md): writer.replicas above 1.

ETCD = f"{FULLNAME}-etcd"
GROUP_RENDERINGS: dict[str, dict[str, Any]] = {
    "group-etcd-from-values": {"writer": {"replicas": 3, "group": {"etcd": ["etcd-a.infra:2379", "etcd-b.infra:2379"]}}, **OPEN},
    "group-own-etcd": {"writer": {"replicas": 3}, "etcd": {"enabled": True}, **OPEN},
    "group-mutual-tls-acl": {
        "writer": {"replicas": 3, "group": {"etcd": ["etcd.infra:2379"]}},
        "tls": {"enabled": True, "secretName": "rmqstore-tls", "clientAuth": True}, **ACL_SECRET,
    },  # fmt: skip
    "group-shared-preferred": {
        "mode": "shared", "writer": {"replicas": 5, "group": {"etcd": ["etcd.infra:2379"], "antiAffinity": "preferred", "minInsync": 3, "replicaPaceMs": 0}}, **OPEN,
    },  # fmt: skip
}
# A writer group takes each replica's id from its pod's pod-index label (Kubernetes 1.28).
GROUP_KUBE_VERSIONS = ("1.28", "1.33")


@pytest.fixture(scope="session")
def group_renderings(chart: helm.Chart) -> dict[str, Rendering]:
    return {name: render(chart, values) for name, values in GROUP_RENDERINGS.items()}


def test_one_writer_replica_renders_todays_single_writer(chart: helm.Chart) -> None:
    single = render(chart, OPEN)
    assert render(chart, {**OPEN, "writer": {"replicas": 1}}).objects == single.objects
    writer = next(c for _, c in single.containers() if c["name"] == "writer")
    assert not {"--group", "--replica-id", "--replicas", "--etcd"} & set(writer["args"])
    assert "RMQSTORE_REPLICA_ID" not in env_of(writer)


@pytest.mark.parametrize("name", sorted(GROUP_RENDERINGS))
@pytest.mark.parametrize("kube_version", GROUP_KUBE_VERSIONS)
def test_group_renderings_lint_and_validate(chart: helm.Chart, name: str, kube_version: str) -> None:
    chart.validate_schema(chart.merge_values(GROUP_RENDERINGS[name]))
    report = helm.lint(CHART, GROUP_RENDERINGS[name], strict=True, kube_version=f"v{kube_version}.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    for obj in render(chart, GROUP_RENDERINGS[name]).objects:
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {kube_version}: {error.message}")


@pytest.mark.parametrize("name", sorted(GROUP_RENDERINGS))
def test_a_writer_group_is_a_statefulset_of_replicas(group_renderings: dict[str, Rendering], name: str) -> None:
    from rmqstore.cli.writer_tools import _peer_tls
    from rmqstore.writer.replication.group import GroupOptions, PeerTls, Replication, parse_replicas

    rendering = group_renderings[name]
    values = rendering.values["writer"]
    count = values["replicas"]
    group_values = {"etcd": [], "antiAffinity": "required", "minInsync": 2, **values.get("group", {})}
    writer = rendering.one("StatefulSet", WRITER)
    spec = writer["spec"]
    assert (spec["replicas"], spec["podManagementPolicy"]) == (count, "Parallel")
    assert rendering.one("Service", spec["serviceName"])["spec"]["clusterIP"] == "None"
    pod = spec["template"]
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "writer")
    # The replica's id is its pod's ordinal, from the pod-index label, expanded by the kubelet.
    (replica_env,) = [e for e in container["env"] if e["name"] == "RMQSTORE_REPLICA_ID"]
    assert replica_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    argv = container["args"]
    assert argv[argv.index("--replica-id") + 1] == "$(RMQSTORE_REPLICA_ID)"
    for ordinal in range(count):
        args = parse_cli([a.replace("$(RMQSTORE_REPLICA_ID)", str(ordinal)) for a in argv])
        options = GroupOptions(
            name=args.group, replica_id=args.replica_id, replicas=parse_replicas(args.replicas),
            replication=Replication(args.replication), min_insync=args.min_insync,
            replica_lag_max_ms=args.replica_lag_max_ms, replica_pace_ms=args.replica_pace_ms,
            etcd=tuple(args.etcd.split(",")), lease_ttl_s=args.lease_ttl_s, peer_tls=_peer_tls(args),
        )  # fmt: skip
        assert options.name == FULLNAME
        assert (options.replica_lag_max_ms, options.replica_pace_ms) == (
            group_values.get("replicaLagMaxMs", 5000), group_values.get("replicaPaceMs", 20)
        )  # values.yaml's defaults
        # Each replica by its pod's stable name under the headless Service.
        assert options.replicas == {k: f"{WRITER}-{k}.{WRITER}.{NAMESPACE}.svc:10911" for k in range(count)}
        assert (options.replication, options.min_insync) == (Replication.SYNC, group_values["minInsync"])
        if group_values["etcd"]:
            assert list(options.etcd) == group_values["etcd"]
        else:
            assert list(options.etcd) == [f"{ETCD}-{k}.{ETCD}.{NAMESPACE}.svc:2379" for k in range(3)]
        # RocketMQ 5 clients are routed to the writer Service: any replica serves them.
        assert args.advertise == f"{WRITER}.{NAMESPACE}.svc:10911"
        # The replicas dial each other as they serve: TLS from the mounted Secret.
        if tls_enabled(rendering):
            mount = Path(next(m for m in container["volumeMounts"] if m["name"] == "tls")["mountPath"])
            assert options.peer_tls == PeerTls(str(mount / "ca.crt"), str(mount / "tls.crt"), str(mount / "tls.key"))
            assert args.tls_client_ca == str(mount / "ca.crt") and args.acl is not None
        else:
            assert options.peer_tls is None
    # Replicas on different nodes, and drains one replica at a time.
    anti = pod["spec"]["affinity"]["podAntiAffinity"]
    if group_values["antiAffinity"] == "required":
        (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    else:
        (weighted,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        term = weighted["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    budget = rendering.one("PodDisruptionBudget", WRITER)["spec"]
    assert budget["maxUnavailable"] == 1
    assert budget["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    # The chart's own etcd only when asked for: members by name, one per replica.
    etcds = [o for o in rendering.objects if o["metadata"]["name"] == ETCD]
    if group_values["etcd"]:
        assert etcds == []
    else:
        members = rendering.one("StatefulSet", ETCD)
        service = rendering.one("Service", ETCD)["spec"]
        assert (service["clusterIP"], service["publishNotReadyAddresses"]) == ("None", True)
        assert members["spec"]["replicas"] == 3
        assert subset(service["selector"], members["spec"]["template"]["metadata"]["labels"])
        assert not subset(service["selector"], pod["metadata"]["labels"])
        etcd_args = members["spec"]["template"]["spec"]["containers"][0]["args"]
        cluster = next(a for a in etcd_args if a.startswith("--initial-cluster="))
        assert cluster == "--initial-cluster=" + ",".join(f"{ETCD}-{k}=http://{ETCD}-{k}.{ETCD}.{NAMESPACE}.svc:2380" for k in range(3))


GROUP_BAD_COMBINATIONS = {
    "min-insync above the replicas": ({"writer": {"replicas": 2, "group": {"minInsync": 3, "etcd": ["e:2379"]}}}, "must not exceed writer.replicas"),
    "a group without etcd": ({"writer": {"replicas": 3}}, "list its members in writer.group.etcd or set etcd.enabled"),
    "etcd without a group": ({"etcd": {"enabled": True}}, "etcd.enabled serves a writer group"),
    "a group under an ACL without mutual TLS": (
        {"writer": {"replicas": 3, "group": {"etcd": ["e:2379"]}}, **ACL_SECRET, "tls": {"enabled": True, "secretName": "s"}},
        "a writer group under an ACL needs tls.enabled and tls.clientAuth",
    ),
}


@pytest.mark.parametrize("case", sorted(GROUP_BAD_COMBINATIONS))
def test_chart_refuses_inconsistent_group_values(chart: helm.Chart, case: str) -> None:
    values, message = GROUP_BAD_COMBINATIONS[case]
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render({**OPEN, **values}, name=RELEASE, namespace=NAMESPACE)


# Cluster mode (docs/cluster.md): writer groups (groups) and the proxies in front (proxy).

PROXY = f"{FULLNAME}-proxy"
PROXY_ON = {"proxy": {"enabled": True}}
CLUSTER_RENDERINGS: dict[str, dict[str, Any]] = {
    "proxy-one-group": {"groups": ["broker-a"], **PROXY_ON, **OPEN},
    "proxy-three-groups": {"groups": ["broker-a", "broker-b", "broker-c"], **PROXY_ON, **OPEN},
    "proxy-three-replicated-groups-shared": {
        "mode": "shared", "groups": ["broker-a", "broker-b", "broker-c"],
        "writer": {"replicas": 3}, "etcd": {"enabled": True},
        "proxy": {"enabled": True, "autoscaling": {"enabled": False}, "replicas": 3, "port": 9081,
                  "lingerMs": 0.5, "batchMax": 64, "cursorKeySecret": "proxy-cursor-key"},
        "console": {"enabled": True, "noAuth": True}, **OPEN,
    },
    "proxy-in-front-of-the-single-writer": {**PROXY_ON, **OPEN},
    # The proxies under the nodes' TLS, ACL and metrics: signing upstream as a user of a
    # Secret, or known to the nodes by their certificate alone.
    "proxy-three-groups-mutual-tls-acl-metrics": {
        "groups": ["broker-a", "broker-b", "broker-c"],
        "proxy": {"enabled": True, "upstreamCredentialsSecret": "proxy-upstream", "healthPort": 7001, "metricsPort": 7002},
        "tls": {"enabled": True, "secretName": "rmqstore-tls", "clientAuth": True}, **ACL_SECRET,
        "metrics": {"prometheus": {"enabled": True}},
    },
    "proxy-by-certificate-under-an-acl": {
        "groups": ["broker-a"], **PROXY_ON,
        "tls": {"enabled": True, "secretName": "rmqstore-tls", "clientAuth": True}, **ACL_SECRET,
    },
    "proxy-tls-open": {**PROXY_ON, "tls": {"enabled": True, "secretName": "rmqstore-tls"}, **OPEN},
    "groups-without-proxy-mutual-tls-acl": {
        "groups": ["broker-a", "broker-b"], "writer": {"replicas": 3, "group": {"etcd": ["etcd.infra:2379"]}},
        "tls": {"enabled": True, "secretName": "rmqstore-tls", "clientAuth": True}, **ACL_SECRET,
    },
}  # fmt: skip


@pytest.fixture(scope="session")
def cluster_renderings(chart: helm.Chart) -> dict[str, Rendering]:
    return {name: render(chart, values) for name, values in CLUSTER_RENDERINGS.items()}


def group_names(rendering: Rendering) -> list[str]:
    return list(rendering.values.get("groups", []))


def group_fullname(group: str) -> str:
    return f"{FULLNAME}-{group}" if group else FULLNAME


@pytest.mark.parametrize("name", sorted(CLUSTER_RENDERINGS))
@pytest.mark.parametrize("kube_version", GROUP_KUBE_VERSIONS)
def test_cluster_renderings_lint_and_validate(chart: helm.Chart, name: str, kube_version: str) -> None:
    chart.validate_schema(chart.merge_values(CLUSTER_RENDERINGS[name]))
    report = helm.lint(CHART, CLUSTER_RENDERINGS[name], strict=True, kube_version=f"v{kube_version}.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    for obj in render(chart, CLUSTER_RENDERINGS[name]).objects:
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {kube_version}: {error.message}")


def test_proxy_disabled_renders_todays_objects(chart: helm.Chart, renderings: dict[str, Rendering]) -> None:
    for name, values in RENDERINGS.items():
        assert not [o for o in renderings[name].objects if o["metadata"]["labels"].get("app.kubernetes.io/component") == "proxy"]
        explicit = render(chart, {**values, "groups": [], "proxy": {"enabled": False}})
        assert explicit.objects == renderings[name].objects, name
        assert explicit.notes == renderings[name].notes, name


@pytest.mark.parametrize("name", sorted(CLUSTER_RENDERINGS))
def test_each_group_is_a_writer_statefulset_with_its_query_nodes(cluster_renderings: dict[str, Rendering], name: str) -> None:
    rendering = cluster_renderings[name]
    shared = is_shared(rendering)
    replicas = value(rendering, "writer", "replicas") or 1
    groups = group_names(rendering) or [""]
    expected = {("ServiceAccount", FULLNAME)}
    store_hosts, elections = set(), set()
    for group in groups:
        writer, query = f"{group_fullname(group)}-writer", f"{group_fullname(group)}-query"
        broker = group or "rmqstore-0"
        expected |= {("StatefulSet", writer), ("Service", writer), ("Service", query)}
        if shared:
            expected |= {("Deployment", query), ("PodDisruptionBudget", query)}
        if replicas > 1:
            expected.add(("PodDisruptionBudget", writer))
        statefulset = rendering.one("StatefulSet", writer)
        assert statefulset["spec"]["replicas"] == replicas
        assert statefulset["spec"]["serviceName"] == writer
        (claim,) = statefulset["spec"]["volumeClaimTemplates"]
        assert claim["metadata"]["name"] == "data"  # the claims: data-<writer>-K, one store per group
        containers = {c["name"]: c for c in statefulset["spec"]["template"]["spec"]["containers"]}
        assert sorted(containers) == (["writer"] if shared else ["query", "writer"])
        # A writer group's replica takes its id from its pod's ordinal (the kubelet expands it).
        writer_args = parse_cli([a.replace("$(RMQSTORE_REPLICA_ID)", "0") for a in containers["writer"]["args"]])
        assert writer_args.handler is writer_tools.cmd_writer_serve
        assert writer_args.broker_name == broker
        assert writer_args.advertise == f"{writer}.{NAMESPACE}.svc:10911"
        store_hosts.add(writer_args.store_host)
        if replicas > 1:
            elections.add(writer_args.group)
            assert writer_args.replicas == ",".join(f"{k}={writer}-{k}.{writer}.{NAMESPACE}.svc:10911" for k in range(replicas))
        if shared:
            deployment = rendering.one("Deployment", query)
            (query_container,) = deployment["spec"]["template"]["spec"]["containers"]
            claim_name = deployment["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
            assert claim_name == f"data-{writer}-0"
        else:
            query_container = containers["query"]
        assert parse_cli(query_container["args"]).broker_name == broker
        if tls_enabled(rendering):
            assert (parse_cli(query_container["args"]).tls_client_ca is not None) is bool(value(rendering, "tls", "clientAuth"))
            assert (writer_args.acl is not None) is bool(value(rendering, "acl", "secretName"))
    if rendering.values.get("etcd", {}).get("enabled"):
        expected |= {("StatefulSet", ETCD), ("Service", ETCD)}  # one etcd for every group's election
    if value(rendering, "proxy", "enabled"):
        expected |= {("ConfigMap", PROXY), ("Deployment", PROXY), ("Service", PROXY), ("PodDisruptionBudget", PROXY)}
        if value(rendering, "proxy", "autoscaling", "enabled") is not False:
            expected.add(("HorizontalPodAutoscaler", PROXY))
    if value(rendering, "console", "enabled"):
        expected |= {("Deployment", CONSOLE), ("Service", CONSOLE)}
    rendered = [(o["kind"], o["metadata"]["name"]) for o in rendering.objects]
    assert sorted(rendered) == sorted(expected)
    # Each group's writers sign their records with a store host of their own (a message id
    # routes to its group by it), and elect their primary under a name of their own.
    assert len(store_hosts) == len(groups)
    if group_names(rendering):
        assert store_hosts == {f"127.0.0.{k + 1}:10911" for k in range(len(groups))}
    if replicas > 1:
        assert len(elections) == len(groups)


@pytest.mark.parametrize("name", sorted(CLUSTER_RENDERINGS))
def test_cluster_selectors_pick_one_workload_each(cluster_renderings: dict[str, Rendering], name: str) -> None:
    rendering = cluster_renderings[name]
    pods = {(w["kind"], w["metadata"]["name"]): w["spec"]["template"] for w in rendering.workloads()}
    for workload in rendering.workloads():
        selector = workload["spec"]["selector"]["matchLabels"]
        assert subset(selector, workload["spec"]["template"]["metadata"]["labels"])
        others = [n for n, p in pods.items() if n != (workload["kind"], workload["metadata"]["name"]) and subset(selector, p["metadata"]["labels"])]
        assert others == [], f"{workload['metadata']['name']}'s selector also picks {others}"
    for service in rendering.kinds("Service"):
        selected = [n for n, p in pods.items() if subset(service["spec"]["selector"], p["metadata"]["labels"])]
        assert len(selected) == 1, f"Service {service['metadata']['name']} selects {selected}"
        port_names = {p["name"] for c in pods[selected[0]]["spec"]["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    for budget in rendering.kinds("PodDisruptionBudget"):
        selected = [n for n, p in pods.items() if subset(budget["spec"]["selector"]["matchLabels"], p["metadata"]["labels"])]
        assert [n for _, n in selected] == [budget["metadata"]["name"]]


@pytest.mark.parametrize("name", sorted(n for n, v in CLUSTER_RENDERINGS.items() if v.get("proxy", {}).get("enabled")))
def test_proxies_serve_the_cluster_file_the_chart_renders(cluster_renderings: dict[str, Rendering], name: str) -> None:
    from rmqstore.cli import proxy_tools
    from rmqstore.proxy.cluster import GroupEndpoints, parse_cluster
    from rmqstore.proxy.node import DEFAULT_BATCH_MAX, DEFAULT_LINGER_MS
    from rmqstore.writer.rocketmq5 import SERVICE_NAME as MESSAGING_SERVICE

    rendering = cluster_renderings[name]
    proxy_values = rendering.values["proxy"]
    replicas = value(rendering, "writer", "replicas") or 1
    # The cluster file, as the proxy reads it: each group's writers (a writer group's
    # replicas in order, by their pods' stable names) and its query Service.
    cluster = rendering.one("ConfigMap", PROXY)["data"]["cluster.yaml"]
    expected = []
    for group in group_names(rendering) or [""]:
        writer, query = f"{group_fullname(group)}-writer", f"{group_fullname(group)}-query"
        writers = tuple(f"{writer}-{k}.{writer}.{NAMESPACE}.svc:10911" for k in range(replicas))
        expected.append(GroupEndpoints(group or "rmqstore-0", writers, (f"{query}.{NAMESPACE}.svc:10912",)))
        # Each name resolves: the pods of the group's headless writer Service, its query Service.
        assert rendering.one("Service", writer)["spec"]["clusterIP"] == "None"
        assert rendering.one("Service", query)["spec"]["ports"][0]["port"] == 10912
    assert parse_cluster(cluster) == tuple(expected)
    deployment = rendering.one("Deployment", PROXY)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = parse_cli(container["args"])
    assert args.handler is proxy_tools.cmd_proxy_serve
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = volumes_of(deployment)
    assert Path(args.cluster) == Path(mounts["cluster"]["mountPath"]) / "cluster.yaml" and mounts["cluster"]["readOnly"]
    assert volumes["cluster"]["configMap"]["name"] == PROXY
    port = proxy_values.get("port", 8081)
    assert (args.host, args.port) == ("0.0.0.0", port)
    health_port, metrics_port = proxy_values.get("healthPort", 10923), proxy_values.get("metricsPort", 9466)
    tls, metrics = tls_enabled(rendering), bool(value(rendering, "metrics", "prometheus", "enabled"))
    assert container["ports"] == [
        {"name": "grpc-proxy", "containerPort": port, "protocol": "TCP"},
        *([{"name": "health-proxy", "containerPort": health_port, "protocol": "TCP"}] if tls else []),
        *([{"name": "metrics-proxy", "containerPort": metrics_port, "protocol": "TCP"}] if metrics else []),
    ]
    check_proxy_security(rendering, deployment, container, args)
    assert args.advertise == (f"{PROXY}.{NAMESPACE}.svc:{port}",)
    assert (args.linger_ms, args.batch_max) == (proxy_values.get("lingerMs", DEFAULT_LINGER_MS), proxy_values.get("batchMax", DEFAULT_BATCH_MAX))
    if proxy_values.get("cursorKeySecret"):
        assert Path(args.cursor_key) == Path(mounts["cursor-key"]["mountPath"]) / "cursor.key" and mounts["cursor-key"]["readOnly"]
        assert volumes["cursor-key"]["secret"]["secretName"] == proxy_values["cursorKeySecret"]
    else:
        assert args.cursor_key is None and "cursor-key" not in mounts
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[kind]["grpc"]["port"] == (health_port if tls else port)
    assert container["readinessProbe"]["grpc"]["service"] == MESSAGING_SERVICE
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["terminationGracePeriodSeconds"] > ProxyNodeKind().shutdown_grace_s
    service = rendering.one("Service", PROXY)["spec"]
    assert service["ports"] == [{"name": "grpc-proxy", "port": port, "targetPort": "grpc-proxy", "protocol": "TCP", "appProtocol": "grpc"}]
    # Scaled by the autoscaler (which then owns the replica count), drained one at a time.
    autoscaled = rendering.kinds("HorizontalPodAutoscaler")
    if proxy_values.get("autoscaling", {}).get("enabled", True):
        (hpa,) = autoscaled
        assert (hpa["spec"]["scaleTargetRef"]["kind"], hpa["spec"]["scaleTargetRef"]["name"]) == ("Deployment", PROXY)
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 10)
        assert "replicas" not in deployment["spec"]
    else:
        assert autoscaled == [] and deployment["spec"]["replicas"] == proxy_values["replicas"]
    assert rendering.one("PodDisruptionBudget", PROXY)["spec"]["maxUnavailable"] == 1
    # The console reads through the proxies.
    if value(rendering, "console", "enabled"):
        console = parse_cli(rendering.one("Deployment", CONSOLE)["spec"]["template"]["spec"]["containers"][0]["args"])
        assert (console.query_endpoint, console.writer_endpoint) == (f"{PROXY}.{NAMESPACE}.svc:{port}", None)
    # The notes name the proxies and every group, and their commands parse.
    assert f"port-forward service/{PROXY} {port}:{port}" in rendering.notes
    for group in group_names(rendering):
        assert f"statefulset/{group_fullname(group)}-writer" in rendering.notes
    for line in rendering.notes.splitlines():
        if line.startswith("  rmqstore "):
            command = parse_cli(shlex.split(line)[1:])
            assert command.endpoint == f"127.0.0.1:{port}"
            # Under TLS the commands trust the chart's CA (and present a certificate where required).
            assert (command.tls_ca is not None) is tls_enabled(rendering)
            assert (command.tls_client_cert is not None) is bool(value(rendering, "tls", "clientAuth"))


def check_proxy_security(rendering: Rendering, deployment: dict[str, Any], container: dict[str, Any], args: Any) -> None:
    """The proxy follows the chart's tls, acl, insecureOpen and metrics as the nodes do
    (docs/cluster.md, "Security"), and reaches the nodes as they require."""
    from rmqstore.proxy.upstream import ACCESS_KEY_ENV, SECRET_KEY_ENV

    proxy_values = rendering.values["proxy"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = volumes_of(deployment)
    env = {e["name"]: e for e in container["env"]}
    tls = rendering.values.get("tls", {})
    if tls.get("enabled"):
        directory = Path(mounts["tls"]["mountPath"])
        assert mounts["tls"]["readOnly"] and volumes["tls"]["secret"]["secretName"] == tls["secretName"]
        assert (Path(args.tls_cert), Path(args.tls_key)) == (directory / "tls.crt", directory / "tls.key")
        assert args.health_port == proxy_values.get("healthPort", 10923)
        assert Path(args.upstream_tls_ca) == directory / "ca.crt"
        if tls.get("clientAuth"):
            assert Path(args.tls_client_ca) == directory / "ca.crt"
            assert (Path(args.upstream_tls_cert), Path(args.upstream_tls_key)) == (directory / "tls.crt", directory / "tls.key")
        else:
            assert args.tls_client_ca is None and args.upstream_tls_cert is None and args.upstream_tls_key is None
    else:
        assert "tls" not in mounts and args.tls_cert is None and args.health_port is None and args.upstream_tls_ca is None
    acl = rendering.values.get("acl", {})
    if acl.get("secretName"):
        assert Path(args.acl) == Path(mounts["acl"]["mountPath"]) / "acl.yaml" and mounts["acl"]["readOnly"]
        assert volumes["acl"]["secret"]["secretName"] == acl["secretName"] and not args.insecure_open
    else:
        assert args.acl is None and "acl" not in mounts and args.insecure_open is bool(rendering.values.get("insecureOpen"))
    credentials = proxy_values.get("upstreamCredentialsSecret")
    if credentials:
        for name, key in ((ACCESS_KEY_ENV, "accessKey"), (SECRET_KEY_ENV, "secretKey")):
            assert env[name]["valueFrom"]["secretKeyRef"] == {"name": credentials, "key": key}
    else:
        assert ACCESS_KEY_ENV not in env and SECRET_KEY_ENV not in env
    assert args.upstream_access_key is None and args.upstream_secret_key is None  # never in the arguments
    annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
    if rendering.values.get("metrics", {}).get("prometheus", {}).get("enabled"):
        metrics_port = proxy_values.get("metricsPort", 9466)
        assert args.metrics_port == metrics_port and metrics_requested({"OTEL_METRICS_EXPORTER": env["OTEL_METRICS_EXPORTER"]["value"]}) == "prometheus"
        assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(metrics_port), "prometheus.io/path": "/metrics"}
    else:
        assert args.metrics_port is None and "OTEL_METRICS_EXPORTER" not in env and annotations == {}


def ProxyNodeKind() -> Any:
    from rmqstore.proxy.node import ProxyNode

    return ProxyNode.KIND


CLUSTER_BAD_VALUES = {
    "group name with capitals": ({"groups": ["Broker-A"]}, "/groups/0"),
    "group named twice": ({"groups": ["broker-a", "broker-a"]}, "/groups"),
    "empty group name": ({"groups": [""]}, "/groups/0"),
    "proxy port out of range": ({"proxy": {"port": 0}}, "/proxy/port"),
    "negative linger": ({"proxy": {"lingerMs": -1}}, "/proxy/lingerMs"),
    "batch of none": ({"proxy": {"batchMax": 0}}, "/proxy/batchMax"),
    "advertise without a port": ({"proxy": {"advertise": "proxy.example"}}, "/proxy/advertise"),
    "misspelt proxy key": ({"proxy": {"replica": 2}}, "replica"),
}


@pytest.mark.parametrize("case", sorted(CLUSTER_BAD_VALUES))
def test_schema_refuses_bad_cluster_values(chart: helm.Chart, case: str) -> None:
    values, where = CLUSTER_BAD_VALUES[case]
    with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
        chart.render({**OPEN, **values}, name=RELEASE, namespace=NAMESPACE)


PROXY_UNKNOWN_UPSTREAM = "proxy.enabled under an ACL: the nodes check the proxies too; give proxy.upstreamCredentialsSecret"
CLUSTER_BAD_COMBINATIONS = {
    "proxy under an ACL with no identity toward the nodes": ({**PROXY_ON, **ACL_SECRET}, PROXY_UNKNOWN_UPSTREAM),
    "proxy under an ACL and TLS without client certificates": (
        {**PROXY_ON, "tls": {"enabled": True, "secretName": "s"}, **ACL_SECRET}, PROXY_UNKNOWN_UPSTREAM,
    ),
    "proxy open to anyone unasked": ({**PROXY_ON, "insecureOpen": False}, "set acl.secretName (an ACL), tls.clientAuth (mutual TLS) or insecureOpen: true"),
    "one store host for every group": ({"groups": ["a", "b"], "store": {"storeHost": "10.0.0.1:10911"}, **OPEN}, "store.storeHost names one writer"),
    "one advertised writer for every group": ({"groups": ["a", "b"], "writer": {"advertise": "mq:443"}, **OPEN}, "writer.advertise names one writer"),
    "console over groups without proxies": ({"groups": ["a", "b"], "console": {"enabled": True, "noAuth": True}, **OPEN}, "set proxy.enabled"),
    "group name too long for the release": ({"groups": ["b" * 40], **OPEN}, "may have 45"),
    "proxy autoscaling minimum above maximum": (
        {**PROXY_ON, "proxy": {"enabled": True, "autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}, **OPEN},
        "proxy.autoscaling.minReplicas",
    ),
}


@pytest.mark.parametrize("case", sorted(CLUSTER_BAD_COMBINATIONS))
def test_chart_refuses_inconsistent_cluster_values(chart: helm.Chart, case: str) -> None:
    values, message = CLUSTER_BAD_COMBINATIONS[case]
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
