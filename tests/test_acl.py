"""The ACL (--acl): signed calls, each action allowed and denied by pattern, Deny over
Allow, source CIDRs, stale and forged signatures, paths for admins only, the CLI signing,
and nodes that refuse to listen beyond loopback without protection. Real gRPC servers on
127.0.0.1 (in process, and as `rmqstore writer serve` processes for the CLI)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.acl import ACL, SECRETS, Guarded, denied, status_of
from support.cli import quiet_env
from support.inprocess import WriterNode
from support.nodes import Nodes
from support.pki import Pki

from rmqstore.client.channels import open_channel
from rmqstore.client.signing import sign, signing_channel
from rmqstore.common.errors import InvalidArgument
from rmqstore.service.acl import load_acl
from rmqstore.service.listen import ListenOptions
from rmqstore.v1 import messages_pb2, query_pb2, query_pb2_grpc, writer_pb2, writer_pb2_grpc

RPC_TIMEOUT_S = 10.0


def send(topic: str, body: bytes = b"b") -> writer_pb2.SendRequest:
    return writer_pb2.SendRequest(message=messages_pb2.Message(topic=topic, body=body))


UNSIGNED = (grpc.StatusCode.UNAUTHENTICATED, "this node needs signed calls: give an access key and secret key", "Unsigned")
WRONG = (grpc.StatusCode.UNAUTHENTICATED, "unknown access key or wrong signature", "BadSignature")


def test_unsigned_calls_are_refused_on_both_nodes_but_health_answers(guarded: Guarded) -> None:
    assert status_of(lambda: guarded.writer_as(None).Send(send("orders-1"), timeout=RPC_TIMEOUT_S)) == UNSIGNED
    assert status_of(lambda: guarded.query_as(None).Ping(query_pb2.PingRequest(), timeout=RPC_TIMEOUT_S)) == UNSIGNED
    for port in (guarded.writer_serving.port, guarded.query_serving.port):
        health = health_pb2_grpc.HealthStub(guarded._channel(port, None))
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_S).status == health_pb2.HealthCheckResponse.SERVING
    assert guarded.writer_serving.acl_interceptor.denials.counts == {("UNAUTHENTICATED", "Unsigned"): 1}
    assert guarded.query_serving.acl_interceptor.denials.counts == {("UNAUTHENTICATED", "Unsigned"): 1}


def raw_signed(guarded: Guarded, metadata: list[tuple[str, str]]) -> Any:
    stub = query_pb2_grpc.QueryServiceStub(guarded._channel(guarded.query_serving.port, None))
    return stub.Ping(query_pb2.PingRequest(), metadata=metadata, timeout=RPC_TIMEOUT_S)


def test_forged_stale_and_malformed_signatures_are_unauthenticated(guarded: Guarded) -> None:
    now = time.time()
    assert raw_signed(guarded, sign("reader", SECRETS["reader"], now)) == query_pb2.PingResponse()
    assert status_of(lambda: raw_signed(guarded, sign("reader", "not-the-secret", now))) == WRONG
    assert status_of(lambda: raw_signed(guarded, sign("nobody", "whatever-secret", now))) == WRONG
    for skew in (-3600, 3600, -301):
        metadata = sign("reader", SECRETS["reader"], now + skew)
        assert status_of(lambda: raw_signed(guarded, metadata)) == (  # noqa: B023
            grpc.StatusCode.UNAUTHENTICATED,
            f"the call was signed at {metadata[0][1]}, more than 300 s from this node's clock",
            "StaleSignature",
        )
    date_time, authorization = (value for _, value in sign("reader", SECRETS["reader"], now))
    # A replayed header with a fresh date no longer matches its signature.
    fresh = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now + 2))
    if fresh != date_time:
        assert status_of(lambda: raw_signed(guarded, [("x-mq-date-time", fresh), ("authorization", authorization)])) == WRONG
    # Upper-case hex and a Credential with a suffix, as some clients send them, are accepted.
    signature = authorization.rsplit("=", 1)[1]
    upper = f"MQv2-HMAC-SHA1 Credential=reader//Rocketmq, SignedHeaders=x-mq-date-time, Signature={signature.upper()}"
    assert raw_signed(guarded, [("x-mq-date-time", date_time), ("authorization", upper)]) == query_pb2.PingResponse()
    # An empty Credential (RocketMQ 5's Python client without an access key) is unsigned.
    empty = f"MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature={signature}"
    assert status_of(lambda: raw_signed(guarded, [("x-mq-date-time", date_time), ("authorization", empty)])) == UNSIGNED
    bad_header = (grpc.StatusCode.UNAUTHENTICATED, "the authorization header is not MQv2-HMAC-SHA1 over x-mq-date-time", "BadSignature")
    for header in (
        "Basic cmVhZGVy",
        authorization.replace("SignedHeaders=x-mq-date-time", "SignedHeaders=x-mq-other"),
        authorization[:-1],
        authorization.replace("MQv2-HMAC-SHA1", "MQv2-HMAC-SHA256"),
    ):
        assert status_of(lambda: raw_signed(guarded, [("x-mq-date-time", date_time), ("authorization", header)])) == bad_header  # noqa: B023
    for stamp in ("", "2026-01-01T00:00:00Z", "20261301T000000Z", "20260101T000000"):
        assert status_of(lambda: raw_signed(guarded, [("x-mq-date-time", stamp), ("authorization", authorization)])) == (  # noqa: B023
            grpc.StatusCode.UNAUTHENTICATED,
            "x-mq-date-time must be YYYYMMDDTHHMMSSZ",
            "BadSignature",
        )


def test_the_signature_is_rocketmq_5s(guarded: Guarded) -> None:
    """HMAC-SHA1 of the x-mq-date-time value under the secret, in hex."""
    metadata = dict(sign("orders", "orders-secret-1", 1_700_000_000))
    assert metadata["x-mq-date-time"] == "20231114T221320Z"
    expected = hmac.new(b"orders-secret-1", b"20231114T221320Z", hashlib.sha1).hexdigest()
    assert metadata["authorization"] == f"MQv2-HMAC-SHA1 Credential=orders, SignedHeaders=x-mq-date-time, Signature={expected}"


def test_each_action_allowed_and_denied_by_pattern(guarded: Guarded) -> None:
    orders, reader, ops = guarded.writer_as("orders"), guarded.writer_as("reader"), guarded.writer_as("ops")
    # Pub
    assert orders.Send(send("orders-eu"), timeout=RPC_TIMEOUT_S).result.offset_msg_id
    assert status_of(lambda: orders.Send(send("payments"), timeout=RPC_TIMEOUT_S)) == denied("User:orders", "Pub", "Topic:payments")
    assert status_of(lambda: reader.Send(send("orders-eu"), timeout=RPC_TIMEOUT_S)) == denied("User:reader", "Pub", "Topic:orders-eu")
    batch = writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic="orders-eu"), messages_pb2.Message(topic="audit")])
    assert status_of(lambda: orders.SendBatch(batch, timeout=RPC_TIMEOUT_S)) == denied("User:orders", "Pub", "Topic:audit")
    columns = writer_pb2.SendBatchRequest(columns=writer_pb2.MessageColumns(bodies=[b"a", b"b"], topics=["orders-eu", "audit"]))
    assert status_of(lambda: orders.SendBatch(columns, timeout=RPC_TIMEOUT_S)) == denied("User:orders", "Pub", "Topic:audit")
    untitled = writer_pb2.SendBatchRequest(columns=writer_pb2.MessageColumns(bodies=[b"a"]))
    assert status_of(lambda: orders.SendBatch(untitled, timeout=RPC_TIMEOUT_S)) == denied("User:orders", "Pub", "Topic:")
    # Deny over Allow: orders-secret matches both Topic:orders-* (Allow) and the Deny.
    assert status_of(lambda: orders.Send(send("orders-secret"), timeout=RPC_TIMEOUT_S)) == denied("User:orders", "Pub", "Topic:orders-secret")
    # Create
    created = orders.CreateTopic(writer_pb2.CreateTopicRequest(name="orders-us", queue_count=2), timeout=RPC_TIMEOUT_S)
    assert created.created
    assert status_of(lambda: orders.CreateTopic(writer_pb2.CreateTopicRequest(name="x", queue_count=2), timeout=RPC_TIMEOUT_S)) == denied(
        "User:orders", "Create", "Topic:x"
    )
    # Update (Flush), List, Get: the cluster's.
    assert status_of(lambda: orders.Flush(writer_pb2.FlushRequest(), timeout=RPC_TIMEOUT_S)) == denied("User:orders", "Update", "Cluster")
    assert status_of(lambda: reader.Flush(writer_pb2.FlushRequest(), timeout=RPC_TIMEOUT_S)) == denied("User:reader", "Update", "Cluster")
    assert ops.Flush(writer_pb2.FlushRequest(), timeout=RPC_TIMEOUT_S).flushed_offset > 0
    assert status_of(lambda: orders.ListTopics(writer_pb2.ListTopicsRequest(), timeout=RPC_TIMEOUT_S)) == denied("User:orders", "List", "Cluster")
    assert [t.name for t in reader.ListTopics(writer_pb2.ListTopicsRequest(), timeout=RPC_TIMEOUT_S).topics] == ["orders-eu", "orders-us"]
    assert status_of(lambda: orders.Status(writer_pb2.StatusRequest(), timeout=RPC_TIMEOUT_S)) == denied("User:orders", "Get", "Cluster")
    # Paths for admins only.
    assert reader.Status(writer_pb2.StatusRequest(), timeout=RPC_TIMEOUT_S).store == ""
    assert ops.Status(writer_pb2.StatusRequest(), timeout=RPC_TIMEOUT_S).store == os.path.abspath(guarded.writer.config.store)
    # Sub, on the query node.
    guarded.view.refresh(force=True)
    pull = query_pb2.PullRequest(topic="orders-eu", queue_id=0, from_offset=0, max_count=10)
    q_orders, q_reader, q_ops = guarded.query_as("orders"), guarded.query_as("reader"), guarded.query_as("ops")
    bounds = query_pb2.QueueBoundsRequest(topic="orders-eu", queue_id=0)
    assert q_orders.QueueBounds(bounds, timeout=RPC_TIMEOUT_S).max_offset >= 0
    assert q_orders.Pull(pull, timeout=RPC_TIMEOUT_S).min_offset == 0
    secret_bounds = query_pb2.QueueBoundsRequest(topic="orders-secret", queue_id=0)
    assert status_of(lambda: q_orders.QueueBounds(secret_bounds, timeout=RPC_TIMEOUT_S)) == denied("User:orders", "Sub", "Topic:orders-secret")
    assert status_of(lambda: q_orders.ListTopics(query_pb2.ListQueryTopicsRequest(), timeout=RPC_TIMEOUT_S)) == denied("User:orders", "List", "Cluster")
    assert status_of(lambda: q_orders.Stats(query_pb2.StatsRequest(), timeout=RPC_TIMEOUT_S)) == denied("User:orders", "Get", "Cluster")
    assert q_reader.Stats(query_pb2.StatsRequest(), timeout=RPC_TIMEOUT_S).store == ""
    assert q_ops.Stats(query_pb2.StatsRequest(), timeout=RPC_TIMEOUT_S).store == guarded.view.root
    msg_id = query_pb2.QueryByMsgIdRequest(msg_id="0" * 32)
    assert status_of(lambda: q_orders.QueryByMsgId(msg_id, timeout=RPC_TIMEOUT_S)) == denied("User:orders", "Sub", "Cluster")
    assert status_of(lambda: q_reader.QueryByMsgId(msg_id, timeout=RPC_TIMEOUT_S))[0] == grpc.StatusCode.NOT_FOUND
    assert guarded.writer_serving.acl_interceptor.denials.counts == {("PERMISSION_DENIED", "Denied"): 11}
    assert guarded.query_serving.acl_interceptor.denials.counts == {("PERMISSION_DENIED", "Denied"): 4}


def test_source_cidrs_limit_where_an_entry_applies(guarded: Guarded) -> None:
    bounds = query_pb2.QueueBoundsRequest(topic="any", queue_id=0)
    assert status_of(lambda: guarded.query_as("remote").QueueBounds(bounds, timeout=RPC_TIMEOUT_S)) == denied("User:remote", "Sub", "Topic:any")
    assert status_of(lambda: guarded.query_as("local").QueueBounds(bounds, timeout=RPC_TIMEOUT_S))[0] == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("as_columns", [False, True])
def test_a_stream_is_checked_message_by_message(guarded: Guarded, as_columns: bool) -> None:
    """A SendStream's allowed request is stored and acknowledged; its next, to a topic
    the user may not write, ends the stream with PERMISSION_DENIED and is not stored
    (its messages sent as ``messages`` or as ``columns``)."""
    stub = guarded.writer_as("orders")
    requests = [
        writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic="orders-eu", body=b"ok")]),
        writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic="payments", body=b"no")]),
    ]
    if as_columns:
        requests = [
            writer_pb2.SendBatchRequest(columns=writer_pb2.MessageColumns(bodies=[b"ok"], topics=["orders-eu"])),
            writer_pb2.SendBatchRequest(columns=writer_pb2.MessageColumns(bodies=[b"no"], topics=["payments"])),
        ]
    acks = []

    def run() -> None:
        for response in stub.SendStream(iter(requests), timeout=RPC_TIMEOUT_S):
            acks.extend(response.results)

    assert status_of(run) == denied("User:orders", "Pub", "Topic:payments")
    assert len(acks) == 1
    assert [name for name, _ in guarded.writer.topics.snapshot().items()] == ["orders-eu"]


BAD_ACLS = [
    ("users: [", "not YAML"),
    ("[1, 2]", "the top level holds users and acls only"),
    ("users:\n  - accessKey: a b\n    secretKey: '12345678'\n", "user 1: accessKey must be 1-128 of [A-Za-z0-9_.@-]"),
    ("users:\n  - accessKey: a\n    secretKey: short\n", "user 1: secretKey must be a string of at least 8 characters"),
    ("users:\n  - {accessKey: a, secretKey: '12345678'}\n  - {accessKey: a, secretKey: '12345678'}\n", "user 2: accessKey a appears twice"),
    ("users:\n  - {accessKey: a, secretKey: '12345678', userType: Root}\n", "user 1: userType must be Super or Normal"),
    ("users:\n  - {accessKey: a, secretKey: '12345678', role: x}\n", "user 1: fields are accessKey, secretKey, userType"),
    ("acls:\n  - subject: User:ghost\n", "acl 1: no user ghost"),
    ("acls:\n  - subject: ghost\n", "acl 1: subject must be User:<accessKey> or Cert:<common name>"),
    ("acls:\n  - subject: Cert:c\n    policies:\n      - {resource: Queue:x, actions: [Pub]}\n", "acl 1 policy 1: resource 'Queue:x' is not"),
    ("acls:\n  - subject: Cert:c\n    policies:\n      - {resource: Topic:x, actions: [Write]}\n", "acl 1 policy 1: actions must be some of Pub, Sub, Create, Update, Get, List"),
    ("acls:\n  - subject: Cert:c\n    policies:\n      - {resource: Topic:x, actions: [Pub], decision: Maybe}\n", "acl 1 policy 1: decision must be Allow or Deny"),
    ("acls:\n  - subject: Cert:c\n    policies:\n      - {resource: Topic:x, actions: [Pub], sourceIps: [10.0.0.300/8]}\n", "acl 1 policy 1: '10.0.0.300/8' is not an IP network"),
]


@pytest.mark.parametrize("text, problem", BAD_ACLS)
def test_a_bad_acl_file_is_refused_naming_the_entry(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "acl.yaml"
    path.write_text(text)
    with pytest.raises(InvalidArgument) as raised:
        load_acl(str(path))
    assert str(raised.value).startswith(f"--acl {path}: {problem}")


def test_a_missing_acl_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="cannot read: No such file or directory"):
        load_acl(str(tmp_path / "none.yaml"))


# The CLI


def test_the_cli_signs_with_its_options_or_the_environment(nodes: Nodes, tmp_path: Path) -> None:
    acl_path = tmp_path / "acl.yaml"
    acl_path.write_text(ACL)
    writer = nodes.start("writer", tmp_path / "store", "--acl", str(acl_path))
    assert writer.serving["acl"] is True
    base = [sys.executable, "-m", "rmqstore.cli.main", "send", "--endpoint", writer.endpoint, "-t", "orders-cli", "-q", "0", "--body", "x"]
    env = {k: v for k, v in quiet_env().items() if not k.startswith("RMQSTORE_")}

    def run(*extra: str, **more_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *extra], env={**env, **more_env}, capture_output=True, text=True, timeout=60, check=False)

    unsigned = run()
    assert (unsigned.returncode, unsigned.stderr.strip()) == (
        2,
        "rmqstore: error: UNAUTHENTICATED: this node needs signed calls: give an access key and secret key",
    )
    by_options = run("--access-key", "orders", "--secret-key", "orders-secret-1")
    assert by_options.returncode == 0, by_options.stderr
    assert json.loads(by_options.stdout)["queueOffset"] == 0
    by_env = run(RMQSTORE_ACCESS_KEY="orders", RMQSTORE_SECRET_KEY="orders-secret-1")
    assert by_env.returncode == 0, by_env.stderr
    assert json.loads(by_env.stdout)["queueOffset"] == 1
    wrong = run(RMQSTORE_ACCESS_KEY="orders", RMQSTORE_SECRET_KEY="orders-secret-2")
    assert (wrong.returncode, wrong.stderr.strip()) == (2, "rmqstore: error: UNAUTHENTICATED: unknown access key or wrong signature")
    half = run("--access-key", "orders")
    assert half.returncode == 2
    assert "give an access key and a secret key together" in half.stderr
    denied_run = run("--access-key", "reader", "--secret-key", "reader-secret-1")
    assert (denied_run.returncode, denied_run.stderr.strip()) == (2, "rmqstore: error: PERMISSION_DENIED: User:reader may not Pub Topic:orders-cli")


@pytest.mark.parametrize("kind", ["writer", "query"])
def test_a_node_refuses_a_non_loopback_address_without_protection(tmp_path: Path, kind: str) -> None:
    (tmp_path / "store").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", kind, "serve", "--store", str(tmp_path / "store"), "--host", "0.0.0.0"],
        env=quiet_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (result.returncode, result.stderr.strip()) == (
        2,
        (
            "rmqstore: error: --host 0.0.0.0 is not a loopback address: give --acl FILE or mutual TLS (--tls-client-ca), "
            "or --insecure-open to let anyone who reaches the port call"
        ),
    )
    assert not (tmp_path / "store" / "commitlog").exists()


def test_a_nodejs_client_signs_with_a_few_lines_of_its_own(guarded: Guarded) -> None:
    """tests/node_client/signed_client.js (@grpc/grpc-js, @grpc/proto-loader, Node's
    crypto) sends through the writer and pulls it back from the query node, signed as
    orders; as an unknown key it is refused."""
    node_modules = Path(sys.prefix) / "node" / "node_modules"
    assert (node_modules / "@grpc" / "grpc-js").is_dir(), "test.sh installs the Node.js client's packages"
    protos = Path(__file__).resolve().parents[1] / "protos"
    script = Path(__file__).parent / "node_client" / "signed_client.js"

    def run(access_key: str, secret_key: str) -> tuple[int, dict[str, Any]]:
        result = subprocess.run(
            ["node", str(script), str(protos), f"127.0.0.1:{guarded.writer_serving.port}", f"127.0.0.1:{guarded.query_serving.port}",
             access_key, secret_key, "orders-node"],
            env={**quiet_env(), "NODE_PATH": str(node_modules)}, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.stdout, result.stderr
        return result.returncode, json.loads(result.stdout.splitlines()[-1])

    assert run("orders", SECRETS["orders"]) == (0, {"queue_offset": 0, "body": "from node"})
    assert run("orders", "not-the-secret") == (1, {"failed": "Send", "code": 16, "details": "unknown access key or wrong signature"})
    assert run("reader", SECRETS["reader"]) == (1, {"failed": "Send", "code": 7, "details": "User:reader may not Pub Topic:orders-node"})


# Mutual TLS


def test_a_client_certificate_is_a_subject_under_mutual_tls(tmp_path: Path, pki: Pki) -> None:
    """Under mutual TLS an unsigned call is its certificate's common name: Cert:<CN>, with
    the policies of that subject; a signed call over the same channel is its user."""
    acl_path = tmp_path / "acl.yaml"
    acl_path.write_text(
        ACL
        + "  - subject: Cert:rmqstore test client\n"
        + "    policies:\n"
        + "      - {resource: 'Topic:tls-*', actions: [Pub, Get]}\n"
        + "      - {resource: Cluster, actions: [Get]}\n"
    )
    listen = ListenOptions(tls_cert=str(pki.server_cert), tls_key=str(pki.server_key), tls_client_ca=str(pki.ca), acl=str(acl_path))
    node = WriterNode(tmp_path / "store", listen=listen)
    channel = open_channel(node.endpoint, ca=str(pki.ca), client_cert=str(pki.client_cert), client_key=str(pki.client_key))
    try:
        stub = writer_pb2_grpc.WriterServiceStub(channel)
        assert stub.Send(send("tls-1"), timeout=RPC_TIMEOUT_S).result.offset_msg_id
        assert status_of(lambda: stub.Send(send("other"), timeout=RPC_TIMEOUT_S)) == denied("Cert:rmqstore test client", "Pub", "Topic:other")
        assert stub.Status(writer_pb2.StatusRequest(), timeout=RPC_TIMEOUT_S).store == ""
        as_ops = writer_pb2_grpc.WriterServiceStub(signing_channel(channel, "ops", SECRETS["ops"]))
        assert as_ops.Status(writer_pb2.StatusRequest(), timeout=RPC_TIMEOUT_S).store == os.path.abspath(tmp_path / "store")
    finally:
        channel.close()
        node.close()


def test_the_pipeline_signs_from_the_environment(guarded: Guarded, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pipeline load`'s calls (the writer's Status, the query node's checks) are signed
    with RMQSTORE_ACCESS_KEY and RMQSTORE_SECRET_KEY, and refused without them."""
    from rmqstore.common.errors import StoreError
    from rmqstore.pipeline import load

    writer_endpoint = f"127.0.0.1:{guarded.writer_serving.port}"
    monkeypatch.delenv("RMQSTORE_ACCESS_KEY", raising=False)
    monkeypatch.delenv("RMQSTORE_SECRET_KEY", raising=False)
    with pytest.raises(StoreError) as raised:
        load.writer_status(writer_endpoint)
    assert str(raised.value) == (
        f"the writer at {writer_endpoint} refused: UNAUTHENTICATED: this node needs signed calls: give an access key and secret key"
    )
    monkeypatch.setenv("RMQSTORE_ACCESS_KEY", "ops")
    monkeypatch.setenv("RMQSTORE_SECRET_KEY", SECRETS["ops"])
    assert load.writer_status(writer_endpoint).store == os.path.abspath(guarded.writer.config.store)
    acked = guarded.writer_as("ops").Send(send("orders-p"), timeout=RPC_TIMEOUT_S).result
    guarded.writer.flush_thoroughly()
    guarded.view.refresh(force=True)
    checker = load.QueryChecker(f"127.0.0.1:{guarded.query_serving.port}")
    try:
        probe = messages_pb2.Message(topic="orders-p", uniq_key=acked.uniq_key)
        assert checker.stored([probe]) == [True]
    finally:
        checker.close()
