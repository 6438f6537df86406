"""A proxy that serves TLS and checks its clients with an ACL, in front of writer groups
and query nodes that serve TLS, require a client certificate and check an ACL of their
own (docs/cluster.md, "Security"): the official Python producer over TLS through it, each
refusal with the status a writer's own gateway gives, the rmqstore.v1 services checked as
the nodes check them; its health port, its Prometheus metrics; bad flags refused before
anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.nodes import Nodes, ProcessNode
from support.pki import Pki
from support.rmq5 import DRIVERS, client_env, rmq5_python
from support.stores import SIZE_ARGS
from test_rocketmq5_acl import ACL as GATEWAY_ACL
from test_rocketmq5_acl import SECRETS

from rmqstore.client import Credentials, Tls, connect
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.v1 import query_pb2, query_pb2_grpc, writer_pb2, writer_pb2_grpc

RPC_TIMEOUT_S = 15.0
CLIENT_TIMEOUT_S = 120.0
# The nodes' ACL: the proxy is their user (a Super user: it relays every client's calls).
NODE_ACL = """
users:
  - accessKey: proxy
    secretKey: proxy-secret-1
    userType: Super
"""
# The proxy's ACL: its clients, as a writer's gateway knows them (test_rocketmq5_acl's),
# and one known by its certificate.
PROXY_ACL = (
    GATEWAY_ACL
    + """  - subject: Cert:rmqstore test client
    policies:
      - resource: ["Topic:orders-*"]
        actions: [Pub]
"""
)
GROUPS = ("broker-a", "broker-b")


def no_route(topic: str) -> dict[str, str]:
    """What the official client hands the application when its route query is refused."""
    return {"topic": topic, "error": "Exception", "message": f"failed to fetch topic:{topic} route."}


def secure_node_args(pki: Pki, acl: Path) -> list[str]:
    """A node's TLS, client certificates required, and its ACL."""
    return ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-client-ca", str(pki.ca), "--acl", str(acl)]


def upstream_args(pki: Pki) -> list[str]:
    return ["--upstream-tls-ca", str(pki.ca), "--upstream-tls-cert", str(pki.client_cert), "--upstream-tls-key", str(pki.client_key)]


def proxy_env(**extra: str) -> dict[str, str]:
    from support.cli import quiet_env

    return {**quiet_env(), "RMQSTORE_UPSTREAM_ACCESS_KEY": "proxy", "RMQSTORE_UPSTREAM_SECRET_KEY": "proxy-secret-1", **extra}


def node_channel(endpoint: str, pki: Pki, user: str | None, secret: str | None = None, *, client_cert: bool = True) -> grpc.Channel:
    tls = Tls(ca=str(pki.ca), client_cert=str(pki.client_cert) if client_cert else None, client_key=str(pki.client_key) if client_cert else None)
    credentials = None if user is None else Credentials(user, secret or SECRETS.get(user, "proxy-secret-1"))
    return connect(endpoint, tls, credentials, unary_spans=False)


class SecureCluster:
    """Two writer groups (one writer each) and a query node for each, all with TLS,
    mutual TLS and the nodes' ACL; a proxy in front of them with TLS and its own ACL."""

    def __init__(self, nodes: Nodes, tmp_path: Path, pki: Pki, *proxy_extra: str, proxy_env_extra: dict[str, str] | None = None):
        self.pki = pki
        node_acl = tmp_path / "node-acl.yaml"
        node_acl.write_text(NODE_ACL)
        self.proxy_acl = tmp_path / "proxy-acl.yaml"
        self.proxy_acl.write_text(PROXY_ACL)
        self.writers: dict[str, ProcessNode] = {}
        self.queries: dict[str, ProcessNode] = {}
        for name in GROUPS:
            store = tmp_path / name
            self.writers[name] = nodes.start("writer", store, *SIZE_ARGS, "--broker-name", name, *secure_node_args(pki, node_acl))
            with node_channel(self.writers[name].endpoint, pki, "proxy") as channel:
                stub = writer_pb2_grpc.WriterServiceStub(channel)
                for topic in ("orders-1", "orders-2", "payments"):
                    stub.CreateTopic(writer_pb2.CreateTopicRequest(name=topic, queue_count=2), timeout=RPC_TIMEOUT_S)
            self.queries[name] = nodes.start("query", store, *SIZE_ARGS, *secure_node_args(pki, node_acl))
        cluster = tmp_path / "cluster.yaml"
        lines = ["groups:"]
        for name in GROUPS:
            lines += [f"  - name: {name}", f'    writers: ["{self.writers[name].endpoint}"]', f'    queries: ["{self.queries[name].endpoint}"]']
        cluster.write_text("\n".join(lines) + "\n")
        args = ["proxy", "serve", "--cluster", str(cluster), "--port", "0", "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
                "--acl", str(self.proxy_acl), *upstream_args(pki), *proxy_extra]  # fmt: skip
        self.proxy = nodes.spawn("proxy", args, env=proxy_env(**(proxy_env_extra or {})))
        self.proxy.wait_serving()


class Client:
    """tests/rocketmq5/acl_producer.py over TLS: one producer, one send per topic."""

    def __init__(self, tmp_path: Path, endpoint: str, pki: Pki):
        self.tmp_path, self.endpoint, self.pki = tmp_path, endpoint, pki
        self.runs = 0

    def send(self, access_key: str, secret_key: str, *topics: str) -> tuple[list[dict[str, Any]], str]:
        self.runs += 1
        home = self.tmp_path / f"client-home-{self.runs}"
        home.mkdir()
        env = {**client_env(home), "TZ": "UTC", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(self.pki.ca)}
        done = subprocess.run(
            [rmq5_python(), str(DRIVERS / "acl_producer.py"), "--tls", self.endpoint, access_key, secret_key, *topics],
            capture_output=True, timeout=CLIENT_TIMEOUT_S, env=env, cwd=self.tmp_path, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
        log = home / "logs" / "rocketmq_python" / "rocketmq_client.log"
        return [json.loads(line) for line in done.stdout.splitlines()], log.read_text(errors="replace")


def receipt(line: dict[str, Any], topic: str) -> str:
    assert line["topic"] == topic and "error" not in line, line
    assert isinstance(line["message_id"], str) and line["message_id"]
    return str(line["message_id"])


def test_the_official_client_through_a_tls_proxy_with_an_acl_to_secure_groups(nodes: Nodes, tmp_path: Path, pki: Pki) -> None:
    """Signed with its key and over TLS, the official producer's sends go through the
    proxy to both groups (which see the proxy's certificate and user); a wrong secret, no
    credentials and a topic out of the user's policies are refused with the status and
    words the writer's own gateway gives; what was acknowledged is found through the
    proxy's QueryService, itself checked as a query node checks it."""
    cluster = SecureCluster(nodes, tmp_path, pki)
    proxy = cluster.proxy
    assert {k: proxy.serving[k] for k in ("tls", "clientAuth", "acl", "upstreamTls", "upstreamSigned")} == {
        "tls": True, "clientAuth": False, "acl": True, "upstreamTls": True, "upstreamSigned": True,
    }  # fmt: skip
    client = Client(tmp_path, proxy.endpoint, pki)

    # The right key and secret: sent and acknowledged, over TLS, through the proxy.
    sent, _ = client.send("orders", SECRETS["orders"], *(["orders-1", "orders-2"] * 4))
    accepted = {receipt(line, line["topic"]): line["topic"] for line in sent}
    assert len(accepted) == 8

    # A wrong secret, an unknown key: the route query is refused UNAUTHORIZED.
    for access_key, secret_key in (("orders", "not-the-secret"), ("stranger", "stranger-secret")):
        sent, log = client.send(access_key, secret_key, "orders-1")
        assert sent == [no_route("orders-1")]
        assert "query topic raise exception, 40100, unknown access key or wrong signature" in log

    # No credentials (the client then signs with an empty access key): unsigned.
    sent, log = client.send("", "", "orders-1")
    assert sent == [no_route("orders-1")]
    assert "query topic raise exception, 40100, this node needs signed calls: give an access key and secret key" in log

    # Pub on orders-* only: another topic is out of its patterns, its route refused.
    sent, log = client.send("pubonly", SECRETS["pubonly"], "orders-1", "payments")
    accepted[receipt(sent[0], "orders-1")] = "orders-1"
    assert sent[1:] == [no_route("payments")]
    assert "query topic raise exception, 40300, User:pubonly may not Pub or Sub Topic:payments" in log

    # Sub on orders-*: the route may be read, the send is FORBIDDEN with the proxy's words.
    sent, _ = client.send("watcher", SECRETS["watcher"], "orders-1")
    assert sent == [{"topic": "orders-1", "error": "ForbiddenException", "message": "40300, User:watcher may not Pub Topic:orders-1"}]

    # Every acknowledged message is stored once, in one of the groups, found through the
    # proxy by an admin of the proxy's ACL (relayed to the query nodes as the proxy).
    with node_channel(proxy.endpoint, pki, "ops", client_cert=False) as channel:
        query = query_pb2_grpc.QueryServiceStub(channel)
        for message_id, topic in accepted.items():
            found = query.QueryByUniqKey(query_pb2.QueryByUniqKeyRequest(topic=topic, uniq_key=message_id), timeout=RPC_TIMEOUT_S)
            assert [(m.topic, m.uniq_key) for m in found.messages] == [(topic, message_id)]
        by_key = query.QueryByKey(query_pb2.QueryByKeyRequest(topic="orders-1", key="acl-orders-1", page_size=100), timeout=RPC_TIMEOUT_S)
        assert by_key.complete and sorted(m.uniq_key for m in by_key.messages) == sorted(k for k, t in accepted.items() if t == "orders-1")
        stored_by = {name: 0 for name in GROUPS}
        for name in GROUPS:
            with node_channel(cluster.queries[name].endpoint, pki, "proxy") as direct:
                page = query_pb2_grpc.QueryServiceStub(direct).QueryByKey(
                    query_pb2.QueryByKeyRequest(topic="orders-1", key="acl-orders-1", page_size=100), timeout=RPC_TIMEOUT_S
                )
                stored_by[name] = len(page.messages)
        assert sum(stored_by.values()) == len(by_key.messages) and all(stored_by.values()), stored_by

    # The rmqstore.v1 services through the proxy, checked as the nodes check them: unsigned
    # UNAUTHENTICATED, a wrong secret UNAUTHENTICATED, a user without Sub PERMISSION_DENIED.
    lookup = query_pb2.QueryByKeyRequest(topic="orders-1", key="acl-orders-1", page_size=10)
    refusals = [
        (None, None, grpc.StatusCode.UNAUTHENTICATED, "this node needs signed calls: give an access key and secret key"),
        ("ops", "wrong-secret-1", grpc.StatusCode.UNAUTHENTICATED, "unknown access key or wrong signature"),
        ("pubonly", SECRETS["pubonly"], grpc.StatusCode.PERMISSION_DENIED, "User:pubonly may not Sub Topic:orders-1"),
    ]
    for user, secret, code, details in refusals:
        with node_channel(proxy.endpoint, pki, user, secret, client_cert=False) as channel, pytest.raises(grpc.RpcError) as refused:
            query_pb2_grpc.QueryServiceStub(channel).QueryByKey(lookup, timeout=RPC_TIMEOUT_S)
        assert (refused.value.code(), refused.value.details()) == (code, details)  # type: ignore[attr-defined]
    with node_channel(proxy.endpoint, pki, "pubonly", client_cert=False) as channel, pytest.raises(grpc.RpcError) as refused:
        writer_pb2_grpc.WriterServiceStub(channel).CreateTopic(writer_pb2.CreateTopicRequest(name="orders-3", queue_count=2), timeout=RPC_TIMEOUT_S)
    assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.PERMISSION_DENIED, "User:pubonly may not Create Topic:orders-3")  # type: ignore[attr-defined]

    # A v2 call of our own without a signature: the v2 answer, not a gRPC error.
    with node_channel(proxy.endpoint, pki, None, client_cert=False) as channel:
        answer = service_pb2_grpc.MessagingServiceStub(channel).SendMessage(
            v2s.SendMessageRequest(messages=[v2.Message(topic=v2.Resource(name="orders-1"), body=b"x", system_properties=v2.SystemProperties(message_id="X1"))]),
            timeout=RPC_TIMEOUT_S,
        )
    assert (answer.status.code, answer.status.message) == (v2.UNAUTHORIZED, "this node needs signed calls: give an access key and secret key")

    # The proxy left no complaint in its log.
    proxy.stop()
    assert "Traceback" not in proxy.stderr_path.read_text(encoding="utf-8", errors="replace")


def v2_send(topic: str, message_id: str) -> v2s.SendMessageRequest:
    system = v2.SystemProperties(message_id=message_id, body_encoding=v2.IDENTITY)
    return v2s.SendMessageRequest(messages=[v2.Message(topic=v2.Resource(name=topic), body=b"x", system_properties=system)])


def test_a_proxy_with_mutual_tls_knows_a_client_by_its_certificate(nodes: Nodes, tmp_path: Path, pki: Pki) -> None:
    """With --tls-client-ca a client without a certificate does not connect; one with a
    certificate and no signature is Cert:<its common name> to the proxy's ACL, as to a
    node's."""
    cluster = SecureCluster(nodes, tmp_path, pki, "--tls-client-ca", str(pki.ca))
    proxy = cluster.proxy
    assert (proxy.serving["tls"], proxy.serving["clientAuth"]) == (True, True)
    with node_channel(proxy.endpoint, pki, "ops", client_cert=False) as channel, pytest.raises(grpc.RpcError) as refused:
        service_pb2_grpc.MessagingServiceStub(channel).SendMessage(v2_send("orders-1", "C1"), timeout=RPC_TIMEOUT_S)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    with node_channel(proxy.endpoint, pki, None) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        sent = stub.SendMessage(v2_send("orders-1", "C2"), timeout=RPC_TIMEOUT_S)
        denied = stub.SendMessage(v2_send("payments", "C3"), timeout=RPC_TIMEOUT_S)
    assert sent.status.code == v2.OK and sent.entries[0].message_id == "C2", sent.status
    assert (denied.status.code, denied.status.message) == (v2.FORBIDDEN, "Cert:rmqstore test client may not Pub Topic:payments")


def test_without_its_upstream_user_the_proxy_is_refused_by_the_nodes(nodes: Nodes, tmp_path: Path, pki: Pki) -> None:
    """The nodes check the proxy: with its certificate but no user, their ACL refuses it
    (a Cert: subject they do not know), and the client is told the groups did not take
    the route query rather than anything being stored."""
    cluster = SecureCluster(nodes, tmp_path, pki, proxy_env_extra={"RMQSTORE_UPSTREAM_ACCESS_KEY": "", "RMQSTORE_UPSTREAM_SECRET_KEY": ""})
    assert cluster.proxy.serving["upstreamSigned"] is False
    with node_channel(cluster.proxy.endpoint, pki, "ops", client_cert=False) as channel:
        answer = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
            v2s.QueryRouteRequest(topic=v2.Resource(name="orders-1")), timeout=RPC_TIMEOUT_S
        )
        assert (answer.status.code, answer.status.message) == (v2.FORBIDDEN, "Cert:rmqstore test client may not Pub or Sub Topic:orders-1")
        with pytest.raises(grpc.RpcError) as refused:
            query_pb2_grpc.QueryServiceStub(channel).QueryByKey(query_pb2.QueryByKeyRequest(topic="orders-1", key="k", page_size=10), timeout=RPC_TIMEOUT_S)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (["--tls-cert", "{pki}/tls.crt"], {}, "give --tls-cert and --tls-key together"),
        (["--tls-client-ca", "{pki}/ca.crt"], {}, "--tls-client-ca needs --tls-cert and --tls-key"),
        (["--host", "0.0.0.0"], {}, "--host 0.0.0.0 is not a loopback address: give --acl FILE or mutual TLS (--tls-client-ca), or --insecure-open to let anyone who reaches the port call"),
        (["--acl", "{tmp}/missing.yaml"], {}, "--acl {tmp}/missing.yaml: cannot read: No such file or directory"),
        (["--upstream-tls-cert", "{pki}/client.crt"], {}, "give --upstream-tls-cert and --upstream-tls-key together"),
        (["--upstream-tls-ca", "{tmp}/missing.crt"], {}, "--upstream-tls-ca {tmp}/missing.crt: cannot read: No such file or directory"),
        (["--upstream-tls-ca", "{pki}/ca.crt", "--upstream-tls-cert", "{pki}/client.crt", "--upstream-tls-key", "{pki}/tls.key"], {},
         "--upstream-tls-key {pki}/tls.key: not an unencrypted PEM private key matching --upstream-tls-cert {pki}/client.crt ("),
        (["--upstream-access-key", "proxy"], {}, "give an upstream access key and secret key together (--upstream-access-key/--upstream-secret-key or RMQSTORE_UPSTREAM_ACCESS_KEY/RMQSTORE_UPSTREAM_SECRET_KEY)"),
        ([], {"RMQSTORE_UPSTREAM_SECRET_KEY": "proxy-secret-1"}, "give an upstream access key and secret key together (--upstream-access-key/--upstream-secret-key or RMQSTORE_UPSTREAM_ACCESS_KEY/RMQSTORE_UPSTREAM_SECRET_KEY)"),
        (["--port", "{port}", "--health-port", "{port}"], {}, "--health-port {port} must differ from --port"),
        (["--metrics-port", "0"], {"OTEL_METRICS_EXPORTER": "none"}, "--metrics-port 0 serves Prometheus metrics: set OTEL_METRICS_EXPORTER=prometheus"),
    ],
)  # fmt: skip
def test_bad_security_flags_stop_the_proxy_before_it_serves(tmp_path: Path, pki: Pki, flags: list[str], env: dict[str, str], message: str) -> None:
    from support.cli import quiet_env

    from rmqstore.service.listen import free_port

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text('groups:\n  - {name: broker-a, writers: ["127.0.0.1:1"]}\n')
    names = {"pki": str(pki.ca.parent), "tmp": str(tmp_path), "port": str(free_port("127.0.0.1"))}
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "proxy", "serve", "--cluster", str(cluster), *(f.format(**names) for f in flags)],
        capture_output=True, text=True, timeout=60, check=False, env={**quiet_env(), **env},
    )  # fmt: skip
    # One line (a key that does not match its certificate ends with OpenSSL's words).
    assert (done.returncode, done.stdout, len(done.stderr.splitlines())) == (2, "", 1), done.stderr
    assert done.stderr.startswith(f"rmqstore: error: {message.format(**names)}"), done.stderr
    assert message.endswith("(") or done.stderr == f"rmqstore: error: {message.format(**names)}\n"


def health_status(endpoint: str) -> int:
    with grpc.insecure_channel(endpoint) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S)
    return int(answer.status)


def scrape(port: int) -> dict[str, Any]:
    """GET /metrics, parsed by prometheus_client's own text parser: family name → family."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode("utf-8")
    return {family.name: family for family in text_string_to_metric_families(text)}


def values(families: dict[str, Any], family: str, sample: str, **labels: str) -> dict[str, float]:
    """A family's samples of that name, by writer group."""
    if family not in families:
        return {}
    return {s.labels["rmqstore_group"]: s.value for s in families[family].samples if s.name == sample and labels.items() <= s.labels.items()}


def test_the_proxys_health_port_and_metrics_count_what_it_coalesced(nodes: Nodes, tmp_path: Path, pki: Pki) -> None:
    """Sends from many callers at once are coalesced: the proxy's Prometheus endpoint
    counts every message and batch per group, the batch sizes adding up to the messages
    sent; a group whose writer is gone counts upstream errors, the other none; the
    plaintext health port answers SERVING."""
    metrics_env = {"OTEL_SDK_DISABLED": "false", "OTEL_METRICS_EXPORTER": "prometheus", "OTEL_TRACES_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
    cluster = SecureCluster(nodes, tmp_path, pki, "--health-port", "0", "--metrics-port", "0", "--linger-ms", "20", proxy_env_extra=metrics_env)
    proxy = cluster.proxy
    assert health_status(f"127.0.0.1:{proxy.serving['healthPort']}") == health_pb2.HealthCheckResponse.SERVING
    metrics_port = proxy.serving["metricsPort"]
    assert isinstance(metrics_port, int) and metrics_port not in (0, proxy.port, proxy.serving["healthPort"])

    senders, per_sender = 8, 25
    with node_channel(proxy.endpoint, pki, "orders", client_cert=False) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)

        def send(sender: int) -> list[int]:
            codes = []
            for number in range(per_sender):
                message = v2.Message(
                    topic=v2.Resource(name="orders-1"), body=b"coalesced",
                    system_properties=v2.SystemProperties(message_id=f"M{sender}N{number}", body_encoding=v2.IDENTITY),
                )  # fmt: skip
                codes.append(stub.SendMessage(v2s.SendMessageRequest(messages=[message]), timeout=RPC_TIMEOUT_S).status.code)
            return codes

        with ThreadPoolExecutor(senders) as pool:
            codes = [code for sent in pool.map(send, range(senders)) for code in sent]
    assert codes == [v2.OK] * senders * per_sender
    total = senders * per_sender
    families = scrape(metrics_port)
    messages = values(families, "rmqstore_proxy_messages", "rmqstore_proxy_messages_total")
    batches = values(families, "rmqstore_proxy_batches", "rmqstore_proxy_batches_total")
    assert set(messages) == set(GROUPS) and sum(messages.values()) == total, messages
    # Coalesced: fewer batches than messages, each group's sizes adding up to its messages.
    assert set(batches) == set(GROUPS) and sum(batches.values()) < total, batches
    assert values(families, "rmqstore_proxy_batch_size", "rmqstore_proxy_batch_size_count") == batches
    assert values(families, "rmqstore_proxy_batch_size", "rmqstore_proxy_batch_size_sum") == messages
    sends = [s.value for s in families["rpc_server_duration_milliseconds"].samples
             if s.name == "rpc_server_duration_milliseconds_count" and s.labels.get("rpc_method") == "SendMessage"]  # fmt: skip
    assert sends == [total]
    assert values(families, "rmqstore_proxy_upstream_errors", "rmqstore_proxy_upstream_errors_total") == {}

    # broker-b's writer gone: its stream ends, counted against broker-b alone.
    cluster.writers["broker-b"].stop()
    with node_channel(proxy.endpoint, pki, "orders", client_cert=False) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for number in range(10):
            message = v2.Message(topic=v2.Resource(name="orders-1"), body=b"x", system_properties=v2.SystemProperties(message_id=f"D{number}"))
            stub.SendMessage(v2s.SendMessageRequest(messages=[message]), timeout=RPC_TIMEOUT_S)
    errors = values(scrape(metrics_port), "rmqstore_proxy_upstream_errors", "rmqstore_proxy_upstream_errors_total")
    assert set(errors) == {"broker-b"} and errors["broker-b"] >= 1, errors
