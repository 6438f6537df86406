"""TLS on the writer and query nodes, and the plaintext health port beside it.

A throwaway CA, a server certificate for 127.0.0.1/localhost and a client certificate are
made at test time (cryptography); real servers listen on 127.0.0.1, port 0."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.http import get
from support.inprocess import WriterNode
from support.nodes import Nodes
from support.pki import Pki
from support.stores import SIZE_ARGS
from support.wait import wait_until

from rmqstore.cli.main import main
from rmqstore.client.channels import open_channel
from rmqstore.common.errors import InvalidArgument
from rmqstore.service.channels import load_server_credentials
from rmqstore.service.listen import ListenOptions
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc
from rmqstore.writer.config import FlushPolicy
from rmqstore.writer.service import SERVICE_NAME as WRITER_SERVICE

RPC_TIMEOUT_S = 10.0
START_TIMEOUT_S = 60.0
VISIBLE_WITHIN_S = 30.0


# Servers


def writer_node_with_tls(store: Path, pki: Pki, client_auth: bool) -> WriterNode:
    """A writer in process: TLS on its port, grpc.health.v1 in plaintext on a second one."""
    client_ca = str(pki.ca) if client_auth else None
    listen = ListenOptions(tls_cert=str(pki.server_cert), tls_key=str(pki.server_key), tls_client_ca=client_ca, health_port=0)
    return WriterNode(store, flush=FlushPolicy.SYNC, listen=listen)


@pytest.fixture
def writer_node(tmp_path: Path, pki: Pki) -> Iterator[WriterNode]:
    node = writer_node_with_tls(tmp_path / "store", pki, client_auth=False)
    yield node
    node.close()


@pytest.fixture
def mutual_writer_node(tmp_path: Path, pki: Pki) -> Iterator[WriterNode]:
    node = writer_node_with_tls(tmp_path / "store", pki, client_auth=True)
    yield node
    node.close()


def send_one(channel: grpc.Channel, key: str = "ORDER-1") -> messages_pb2.SendResult:
    stub = writer_pb2_grpc.WriterServiceStub(channel)
    request = writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic="TopicTls", body=b"hello", keys=[key])])
    (response,) = list(stub.SendStream(iter([request]), timeout=RPC_TIMEOUT_S))
    (result,) = response.results
    return result


def health_status(channel: grpc.Channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S).status


# TLS on the wire


def test_tls_round_trip_and_plaintext_refused(writer_node: WriterNode, pki: Pki) -> None:
    with open_channel(writer_node.endpoint, ca=str(pki.ca)) as channel:
        result = send_one(channel)
        assert result.topic == "TopicTls" and result.offset_msg_id
        # The health service answers on the TLS port too.
        assert health_status(channel, WRITER_SERVICE) == health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(writer_node.endpoint) as plaintext:
        with pytest.raises(grpc.RpcError) as refused:
            send_one(plaintext)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_client_trusting_another_ca_is_refused(writer_node: WriterNode, pki: Pki) -> None:
    with open_channel(writer_node.endpoint, ca=str(pki.other_ca)) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            send_one(channel)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_plaintext_health_port_serves_only_health(writer_node: WriterNode) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{writer_node.health_port}") as channel:
        assert health_status(channel) == health_pb2.HealthCheckResponse.SERVING
        assert health_status(channel, WRITER_SERVICE) == health_pb2.HealthCheckResponse.SERVING
        # Nothing but grpc.health.v1 in plaintext: the writer's API is not there.
        with pytest.raises(grpc.RpcError) as missing:
            send_one(channel)
        assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # One HealthServicer: a graceful stop shows on the health port as well.
        writer_node.serving.call(writer_node.serving.health_servicer.enter_graceful_shutdown())
        assert health_status(channel, WRITER_SERVICE) == health_pb2.HealthCheckResponse.NOT_SERVING


def test_client_auth_requires_a_certificate_signed_by_the_ca(mutual_writer_node: WriterNode, pki: Pki) -> None:
    with open_channel(mutual_writer_node.endpoint, ca=str(pki.ca)) as anonymous:
        with pytest.raises(grpc.RpcError) as refused:
            send_one(anonymous)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    with open_channel(
        mutual_writer_node.endpoint, ca=str(pki.ca), client_cert=str(pki.client_cert), client_key=str(pki.client_key)
    ) as channel:
        assert send_one(channel).offset_msg_id
    with grpc.insecure_channel(f"127.0.0.1:{mutual_writer_node.health_port}") as channel:
        assert health_status(channel) == health_pb2.HealthCheckResponse.SERVING


# Bad files


def test_bad_server_files_are_refused_with_their_path(pki: Pki, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    text = tmp_path / "text.txt"
    text.write_text("hello\n")
    cases = [
        ((str(tmp_path / "missing.crt"), str(pki.server_key), None), "--tls-cert " + str(tmp_path / "missing.crt")),
        ((str(garbage), str(pki.server_key), None), f"--tls-cert {garbage}"),
        ((str(pki.server_cert), str(text), None), f"--tls-key {text}"),
        # A key that does not match the certificate.
        ((str(pki.server_cert), str(pki.client_key), None), f"--tls-key {pki.client_key}"),
        ((str(pki.server_cert), str(pki.server_key), str(garbage)), f"--tls-client-ca {garbage}"),
    ]
    for arguments, where in cases:
        with pytest.raises(InvalidArgument, match=f"^{where}"):
            load_server_credentials(*arguments)


@pytest.mark.parametrize("kind", ["writer", "query"])
def test_serve_with_a_bad_certificate_path_exits_2_with_one_clear_line(kind: str, tmp_path: Path, pki: Pki) -> None:
    missing = tmp_path / "nope" / "tls.crt"
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", kind, "serve", "--store", str(tmp_path / "store"),
         "--port", "0", "--tls-cert", str(missing), "--tls-key", str(pki.server_key)],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [f"rmqstore: error: --tls-cert {missing}: cannot read: No such file or directory"]
    assert not (tmp_path / "store").exists(), "the node started before checking its certificate"


def test_inconsistent_tls_options_are_refused(tmp_path: Path, pki: Pki, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "store")
    assert main(["query", "serve", "--store", store, "--tls-cert", str(pki.server_cert)]) == 2
    assert "give --tls-cert and --tls-key together" in capsys.readouterr().err
    assert main(["writer", "serve", "--store", store, "--tls-client-ca", str(pki.ca)]) == 2
    assert "--tls-client-ca needs --tls-cert" in capsys.readouterr().err
    assert main(["send", "--endpoint", "127.0.0.1:1", "-t", "T", "--body", "x", "--tls-client-cert", str(pki.client_cert)]) == 2
    assert "--tls-client-cert and --tls-client-key together" in capsys.readouterr().err
    assert main(["queryMsgByKey", "--store", store, "-t", "T", "-k", "K", "--tls-ca", str(pki.ca)]) == 2
    assert "apply to --endpoint" in capsys.readouterr().err
    assert not Path(store).exists()


# The CLI end to end


def test_cli_send_and_lookups_over_tls(nodes: Nodes, tmp_path: Path, pki: Pki, capsys: pytest.CaptureFixture[str]) -> None:
    """``rmqstore writer serve`` and ``rmqstore query serve`` with TLS and a health port,
    ``rmqstore send`` and ``queryMsgByKey`` with --tls-ca."""
    store = tmp_path / "store"
    tls = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--health-port", "0"]
    writer = nodes.start("writer", store, *SIZE_ARGS, "--flush", "sync", *tls)
    try:
        assert (writer.serving["tls"], writer.serving["clientAuth"]) == (True, False)
        with grpc.insecure_channel(f"127.0.0.1:{writer.serving['healthPort']}") as channel:
            assert health_status(channel, WRITER_SERVICE) == health_pb2.HealthCheckResponse.SERVING
        trust = ["--tls-ca", str(pki.ca)]
        assert main(["send", "--endpoint", writer.endpoint, "-t", "TopicTls", "-k", "ORDER-7", "--body", "hi", *trust]) == 0
        ack = json.loads(capsys.readouterr().out)
        assert ack["topic"] == "TopicTls"
        # Plaintext against the TLS port: one error line, exit 2.
        assert main(["send", "--endpoint", writer.endpoint, "-t", "TopicTls", "--body", "x", "--timeout", "10"]) == 2
        assert "UNAVAILABLE" in capsys.readouterr().err
        # A certificate for another name is refused; --tls-server-name names the right one.
        assert main(["send", "--endpoint", f"localhost:{writer.serving['port']}", "-t", "TopicTls", "--body", "y",
                     *trust, "--tls-server-name", "wrong.example", "--timeout", "10"]) == 2  # fmt: skip
        assert "UNAVAILABLE" in capsys.readouterr().err
        assert main(["send", "--endpoint", writer.endpoint, "-t", "TopicTls", "--body", "z",
                     *trust, "--tls-server-name", "localhost"]) == 0  # fmt: skip
        capsys.readouterr()

        query = nodes.start("query", store, *SIZE_ARGS, "--tls-client-ca", str(pki.ca), *tls)
        try:
            assert (query.serving["tls"], query.serving["clientAuth"]) == (True, True)
            with grpc.insecure_channel(f"127.0.0.1:{query.serving['healthPort']}") as channel:
                assert health_status(channel) == health_pb2.HealthCheckResponse.SERVING
            lookup = ["queryMsgByUniqueKey", "--endpoint", query.endpoint, "-t", "TopicTls", "-i", ack["uniqKey"], "--json"]
            mutual = [*trust, "--tls-client-cert", str(pki.client_cert), "--tls-client-key", str(pki.client_key)]
            def found_it() -> bool:
                status = main([*lookup, *mutual])
                assert status in (0, 1), capsys.readouterr().err
                if status == 1:
                    capsys.readouterr()
                return status == 0

            wait_until(found_it, VISIBLE_WITHIN_S, "the query node to find the message", interval_s=0.2)
            (found,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
            assert (found["msgId"], found["keys"]) == (ack["offsetMsgId"], "ORDER-7")
            assert main(["queryMsgByKey", "--endpoint", query.endpoint, "-t", "TopicTls", "-k", "ORDER-7", *mutual]) == 0
            assert ack["offsetMsgId"] in capsys.readouterr().out
            # Client auth: trusting the CA is not enough without a certificate of one's own.
            assert main([*lookup, *trust]) == 2
            assert "UNAVAILABLE" in capsys.readouterr().err
        finally:
            query.stop()
    finally:
        writer.stop()


def test_console_reads_nodes_over_mutual_tls(nodes: Nodes, tmp_path: Path, pki: Pki, capsys: pytest.CaptureFixture[str]) -> None:
    """``rmqstore console`` with the same --tls-* options as the other clients, for both
    endpoints; without its client certificate the query node refuses it and the pages say so."""
    store = tmp_path / "store"
    tls = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-client-ca", str(pki.ca), "--health-port", "0"]
    mutual = ["--tls-ca", str(pki.ca), "--tls-client-cert", str(pki.client_cert), "--tls-client-key", str(pki.client_key)]
    writer = nodes.start("writer", store, *SIZE_ARGS, "--flush", "sync", *tls)
    try:
        assert main(["send", "--endpoint", writer.endpoint, "-t", "TopicTls", "-k", "ORDER-9", "--body", "hi", *mutual]) == 0
        ack = json.loads(capsys.readouterr().out)
        query = nodes.start("query", store, *SIZE_ARGS, *tls)
        try:
            endpoints = ["--query-endpoint", query.endpoint, "--writer-endpoint", writer.endpoint]
            console = nodes.console(*endpoints, *mutual)
            try:

                def searched() -> list[Any]:
                    status, _, body = get(f"{console.url}/api/search?mode=key&topic=TopicTls&key=ORDER-9")
                    found: list[Any] = json.loads(body).get("messages", [])
                    return found if status == 200 else []

                found = wait_until(searched, VISIBLE_WITHIN_S, "the console to find the message", interval_s=0.2)
                assert [m["msgId"] for m in found] == [ack["offsetMsgId"]]
                status, _, body = get(f"{console.url}/api/nodes")
                assert status == 200 and json.loads(body)["writer"]["store"] == str(store)
            finally:
                console.stop()
            console = nodes.console(*endpoints, "--tls-ca", str(pki.ca), "--timeout", "5")
            try:
                status, _, body = get(f"{console.url}/api/topics")
                assert status == 502 and json.loads(body)["error"].startswith("the node answered UNAVAILABLE")
            finally:
                console.stop()
        finally:
            query.stop()
    finally:
        writer.stop()
