"""TLS on the writer and query nodes, and the plaintext health port beside it.

A throwaway CA, a server certificate for 127.0.0.1/localhost and a client certificate are
made at test time (cryptography); real servers listen on 127.0.0.1, port 0."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rmqstore.cli.main import main
from rmqstore.common.errors import InvalidArgument
from rmqstore.common.files.store import StoreSizes
from rmqstore.service.channels import load_server_credentials, open_channel
from rmqstore.service.server import AsyncServing
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc
from rmqstore.writer.config import FlushPolicy, WriterConfig
from rmqstore.writer.service import SERVICE_NAME as WRITER_SERVICE
from rmqstore.writer.service import WriterServicer
from rmqstore.writer.store import Writer

SMALL = StoreSizes(commitlog_file_size_bytes=65536, cq_file_units=50, index_slots=17, index_entries=200)
SIZE_ARGS = ["--commitlog-file-size", "65536", "--cq-file-units", "50", "--index-slots", "17", "--index-entries", "200"]
RPC_TIMEOUT_S = 10.0
START_TIMEOUT_S = 60.0
VISIBLE_WITHIN_S = 30.0


# Certificates


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    sans: list[x509.GeneralName] | None = None,
    usage: x509.ObjectIdentifier | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ),  # fmt: skip
            critical=True,
        )
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    where = tmp_path_factory.mktemp("pki")
    ca_key = _key()
    ca = _certificate("rmqstore test CA", ca_key, None, ca_key, ca=True)
    server_key = _key()
    server = _certificate(
        "rmqstore test server", server_key, ca.subject, ca_key,
        sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
    )  # fmt: skip
    client_key = _key()
    client = _certificate("rmqstore test client", client_key, ca.subject, ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    other_key = _key()
    other = _certificate("some other CA", other_key, None, other_key, ca=True)
    return Pki(
        ca=_write_cert(ca, where / "ca.crt"),
        server_cert=_write_cert(server, where / "tls.crt"),
        server_key=_write_key(server_key, where / "tls.key"),
        client_cert=_write_cert(client, where / "client.crt"),
        client_key=_write_key(client_key, where / "client.key"),
        other_ca=_write_cert(other, where / "other-ca.crt"),
    )


# Servers


class WriterNode:
    """A writer in process: TLS on its port, grpc.health.v1 in plaintext on a second one."""

    def __init__(self, store: Path, pki: Pki, client_auth: bool):
        self.writer = Writer(WriterConfig(store=str(store), sizes=SMALL, flush=FlushPolicy.SYNC))
        self.servicer = WriterServicer(self.writer)
        try:
            credentials = load_server_credentials(
                str(pki.server_cert), str(pki.server_key), str(pki.ca) if client_auth else None
            )
            self.serving = AsyncServing(
                lambda s: writer_pb2_grpc.add_WriterServiceServicer_to_server(self.servicer, s),
                [WRITER_SERVICE],
                host="127.0.0.1",
                port=0,
                credentials=credentials,
                health_port=0,
            )
        except BaseException:
            self.servicer.close()
            self.writer.close()
            raise
        self.endpoint = f"127.0.0.1:{self.serving.port}"
        self.health_port = self.serving.health_port

    def close(self) -> None:
        self.serving.stop(None)
        self.servicer.close()
        self.writer.close()


@pytest.fixture
def writer_node(tmp_path: Path, pki: Pki) -> Iterator[WriterNode]:
    node = WriterNode(tmp_path / "store", pki, client_auth=False)
    yield node
    node.close()


@pytest.fixture
def mutual_writer_node(tmp_path: Path, pki: Pki) -> Iterator[WriterNode]:
    node = WriterNode(tmp_path / "store", pki, client_auth=True)
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


class NodeProcess:
    """``rmqstore <kind> serve`` as a subprocess; its serving line is parsed."""

    def __init__(self, kind: str, store: Path, extra: list[str]):
        self.kind = kind
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rmqstore.cli.main", kind, "serve", "--store", str(store),
             "--host", "127.0.0.1", "--port", "0", *SIZE_ARGS, *extra],  # fmt: skip
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        stdout = self.proc.stdout
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            first = lines.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            self.stop()
            pytest.fail(f"{kind} did not start within {START_TIMEOUT_S} s")
        if not first:
            _, stderr = self.proc.communicate(timeout=30)
            pytest.fail(f"{kind} exited with {self.proc.returncode} before serving: {stderr}")
        self.serving = json.loads(first)
        self.endpoint = f"127.0.0.1:{self.serving['port']}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            stdout, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            pytest.fail(f"{self.kind} did not stop")
        assert self.proc.returncode == 0
        assert json.loads(stdout.splitlines()[-1]) == {"event": "stopped", "service": self.kind}


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


def test_cli_send_and_lookups_over_tls(tmp_path: Path, pki: Pki, capsys: pytest.CaptureFixture[str]) -> None:
    """``rmqstore writer serve`` and ``rmqstore query serve`` with TLS and a health port,
    ``rmqstore send`` and ``queryMsgByKey`` with --tls-ca."""
    store = tmp_path / "store"
    tls = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--health-port", "0"]
    writer = NodeProcess("writer", store, ["--flush", "sync", *tls])
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

        query = NodeProcess("query", store, ["--tls-client-ca", str(pki.ca), *tls])
        try:
            assert (query.serving["tls"], query.serving["clientAuth"]) == (True, True)
            with grpc.insecure_channel(f"127.0.0.1:{query.serving['healthPort']}") as channel:
                assert health_status(channel) == health_pb2.HealthCheckResponse.SERVING
            lookup = ["queryMsgByUniqueKey", "--endpoint", query.endpoint, "-t", "TopicTls", "-i", ack["uniqKey"], "--json"]
            mutual = [*trust, "--tls-client-cert", str(pki.client_cert), "--tls-client-key", str(pki.client_key)]
            deadline = time.monotonic() + VISIBLE_WITHIN_S
            while (status := main([*lookup, *mutual])) != 0:
                assert status == 1 and time.monotonic() < deadline, capsys.readouterr().err
                capsys.readouterr()
                time.sleep(0.2)
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


def test_console_reads_nodes_over_mutual_tls(tmp_path: Path, pki: Pki, capsys: pytest.CaptureFixture[str]) -> None:
    """``rmqstore console`` with the same --tls-* options as the other clients, for both
    endpoints; without its client certificate the query node refuses it and the pages say so."""
    from test_console import ConsoleProcess, get

    store = tmp_path / "store"
    tls = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-client-ca", str(pki.ca), "--health-port", "0"]
    mutual = ["--tls-ca", str(pki.ca), "--tls-client-cert", str(pki.client_cert), "--tls-client-key", str(pki.client_key)]
    writer = NodeProcess("writer", store, ["--flush", "sync", *tls])
    try:
        assert main(["send", "--endpoint", writer.endpoint, "-t", "TopicTls", "-k", "ORDER-9", "--body", "hi", *mutual]) == 0
        ack = json.loads(capsys.readouterr().out)
        query = NodeProcess("query", store, tls)
        try:
            endpoints = ["--query-endpoint", query.endpoint, "--writer-endpoint", writer.endpoint]
            console = ConsoleProcess([*endpoints, *mutual], tmp_path / "console.stderr")
            try:
                deadline = time.monotonic() + VISIBLE_WITHIN_S
                while True:
                    status, _, body = get(f"{console.url}/api/search?mode=key&topic=TopicTls&key=ORDER-9")
                    found = json.loads(body).get("messages", [])
                    if status == 200 and found:
                        break
                    assert time.monotonic() < deadline, body
                    time.sleep(0.2)
                assert [m["msgId"] for m in found] == [ack["offsetMsgId"]]
                status, _, body = get(f"{console.url}/api/nodes")
                assert status == 200 and json.loads(body)["writer"]["store"] == str(store)
            finally:
                console.stop()
            console = ConsoleProcess([*endpoints, "--tls-ca", str(pki.ca), "--timeout", "5"], tmp_path / "console-2.stderr")
            try:
                status, _, body = get(f"{console.url}/api/topics")
                assert status == 502 and json.loads(body)["error"].startswith("the node answered UNAVAILABLE")
            finally:
                console.stop()
        finally:
            query.stop()
    finally:
        writer.stop()
