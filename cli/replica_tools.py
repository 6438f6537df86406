"""``rmqstore replicas``: a writer group's replicas as one of them sees them (docs/replication.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import grpc

from rmqstore.cli import exits
from rmqstore.cli.exits import EXIT_OK
from rmqstore.cli.writer_tools import add_client_tls_options, channel_from
from rmqstore.common.errors import InvalidArgument, Unavailable
from rmqstore.v1 import replication_pb2, replication_pb2_grpc

STATUS_TIMEOUT_S = 5.0


def not_a_replica(endpoint: str, error: grpc.RpcError) -> InvalidArgument | None:
    """What to say when ``endpoint`` answered that it serves no ReplicationService."""
    if error.code() != grpc.StatusCode.UNIMPLEMENTED:
        return None
    return InvalidArgument(f"{endpoint} is not a replica of a writer group (a writer started without --group, or another node)")


def replica_status(args: argparse.Namespace, endpoint: str) -> replication_pb2.ReplicaStatusResponse:
    with channel_from(args, endpoint) as channel:
        stub = replication_pb2_grpc.ReplicationServiceStub(channel)  # type: ignore[no-untyped-call]  # generated
        try:
            answer: replication_pb2.ReplicaStatusResponse = stub.ReplicaStatus(replication_pb2.ReplicaStatusRequest(), timeout=STATUS_TIMEOUT_S)
        except grpc.RpcError as error:
            refusal = not_a_replica(endpoint, error)
            if refusal is not None:
                raise refusal from None
            raise
        return answer


def endpoints_of(text: str) -> list[str]:
    """The endpoints of ``HOST:PORT[,HOST:PORT…]`` (checked by the parser: exits.endpoints)."""
    return text.split(",")


def find_primary(args: argparse.Namespace, endpoints: list[str]) -> tuple[str, replication_pb2.ReplicaStatusResponse]:
    """The primary's endpoint and status, asked of the replicas listed in turn (a
    follower names the primary)."""
    problems = []
    for endpoint in endpoints:
        try:
            status = replica_status(args, endpoint)
        except grpc.RpcError as error:
            problems.append(f"{endpoint}: {error.code().name}")
            continue
        if status.role == "primary":
            return endpoint, status
        if status.primary_endpoint:
            try:
                primary = replica_status(args, status.primary_endpoint)
            except grpc.RpcError as error:
                problems.append(f"{status.primary_endpoint}: {error.code().name}")
                continue
            if primary.role == "primary":
                return status.primary_endpoint, primary
        problems.append(f"{endpoint}: a follower that knows no primary")
    raise Unavailable(f"no primary found ({'; '.join(problems)})")


def cmd_replicas(args: argparse.Namespace) -> int:
    endpoints = endpoints_of(args.endpoint)
    try:
        _, primary = find_primary(args, endpoints)
        group = primary
    except Unavailable:
        primary = None
        group = replica_status(args, endpoints[0])
    followers = {f.replica_id: f for f in primary.followers} if primary is not None else {}
    rows: list[dict[str, Any]] = []
    for replica_id, endpoint in sorted(group.replicas.items()):
        row: dict[str, Any] = {"id": replica_id, "endpoint": endpoint}
        try:
            status = replica_status(args, endpoint)
        except grpc.RpcError as error:
            row.update(role="unreachable", error=error.code().name)
            rows.append(row)
            continue
        row.update(role=status.role, epoch=status.epoch, endOffset=status.end_offset)
        if status.role == "primary":
            row.update(lagBytes=0, lagMs=0, inSync=True)
        elif replica_id in followers:
            seen = followers[replica_id]
            row.update(lagBytes=seen.lag_bytes, lagMs=seen.lag_ms, inSync=seen.in_sync, connected=seen.connected)
        rows.append(row)
    if args.json:
        print(json.dumps({"group": group.group, "replication": group.replication, "minInsync": group.min_insync, "replicas": rows}))
    else:
        print(f"group {group.group}: replication {group.replication}, min-insync {group.min_insync}")
        print(f"{'ID':>3}  {'ENDPOINT':<22} {'ROLE':<11} {'EPOCH':>6} {'END OFFSET':>14} {'LAG BYTES':>12} {'LAG MS':>8}  IN SYNC")
        for row in rows:
            print(
                f"{row['id']:>3}  {row['endpoint']:<22} {row['role']:<11} {row.get('epoch', ''):>6} {row.get('endOffset', ''):>14} "
                f"{row.get('lagBytes', ''):>12} {row.get('lagMs', ''):>8}  {'yes' if row.get('inSync') else 'no'}"
            )
    sys.stdout.flush()
    return EXIT_OK


def cmd_writer_promote(args: argparse.Namespace) -> int:
    with channel_from(args, args.endpoint) as channel:
        stub = replication_pb2_grpc.ReplicationServiceStub(channel)  # type: ignore[no-untyped-call]  # generated
        try:
            promoted = stub.Promote(replication_pb2.PromoteRequest(), timeout=args.timeout)
        except grpc.RpcError as error:
            refusal = not_a_replica(args.endpoint, error)
            if refusal is not None:
                raise refusal from None
            raise
    print(json.dumps({"endpoint": args.endpoint, "epoch": promoted.epoch, "startOffset": promoted.start_offset}))
    return EXIT_OK


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    replicas = commands.add_parser("replicas", help="a writer group's replicas: role, epoch, end offset, lag, in sync")
    replicas.add_argument("--endpoint", required=True, type=exits.endpoints, metavar="HOST:PORT[,HOST:PORT...]", help="any replica(s) of the group")
    replicas.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    add_client_tls_options(replicas)
    replicas.set_defaults(handler=cmd_replicas)
