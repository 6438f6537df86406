"""RocketMQ 5 clients served by any replica: a follower passes each call of
``apache.rocketmq.v2.MessagingService`` on to the primary it knows and answers with the
primary's answer (docs/replication.md, "RocketMQ 5 clients").

Why: the official clients keep a topic's route for 30 s and dial its endpoints; a route that
named the primary would send them to a dead or demoted replica after every failover until
they asked again. Each replica's routes name the replica itself instead, and whatever it
is asked it forwards to the primary of the moment, so a client keeps working across
failovers with the endpoints it was configured with. QueryRoute is answered by the replica
itself (the topic table is replicated); a replica that is the primary, or knows no primary,
serves every call itself (a follower's own answers refuse writes, naming the primary), and
so does one that receives a call another replica forwarded: a call is forwarded once."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.service.acl import Answered
from rmqstore.service.errors import StreamRefusal
from rmqstore.writer.replication.replica import Replica, Role

log = logging.getLogger("rmqstore.writer.replication")

SERVICE = v2s.DESCRIPTOR.services_by_name["MessagingService"]
# Answered by the replica asked: its routes name itself (module docstring).
LOCAL_METHODS = frozenset({"QueryRoute"})
# Transport headers the forwarding call makes its own.
_HOP_HEADERS = frozenset(
    {"user-agent", "content-type", "te", "grpc-accept-encoding", "grpc-timeout"}
)


# Set on a forwarded call: its receiver serves it, never forwards it again (two replicas
# that each take the other for the primary, for a moment, would pass a call to and fro).
FORWARDED_HEADER = "x-rmqstore-forwarded-by"


def _forwarded_metadata(context: grpc.aio.ServicerContext, replica_id: int) -> tuple[tuple[str, Any], ...]:
    """The client's metadata (its id, language, signature…), as the primary must see it."""
    return (
        *(
            (key, value)
            for key, value in context.invocation_metadata() or ()
            if not key.startswith(":") and key not in _HOP_HEADERS
        ),
        (FORWARDED_HEADER, str(replica_id)),
    )


def _was_forwarded(context: grpc.aio.ServicerContext) -> bool:
    return any(key == FORWARDED_HEADER for key, _ in context.invocation_metadata() or ())


class ForwardingServicer:
    """``messaging`` (the writer's MessagingServicer) behind a switch: a follower that knows
    its primary forwards each call there; otherwise the call is served here."""

    def __init__(self, messaging: Any, replica: Replica):
        self._messaging = messaging
        self._replica = replica
        self._channels: dict[str, grpc.aio.Channel] = {}
        for method in SERVICE.methods:
            setattr(self, method.name, self._method(method))

    def _target(self, context: grpc.aio.ServicerContext) -> str | None:
        """The primary's endpoint, when this call goes there."""
        replica = self._replica
        if replica.role is Role.PRIMARY or _was_forwarded(context):
            return None
        return replica.primary_endpoint

    def _callable(self, target: str, method: Any) -> Any:
        channel = self._channels.get(target)
        if channel is None:
            channel = self._replica.options.peer_aio_channel(target, (("grpc.use_local_subchannel_pool", 1),))
            self._channels[target] = channel
        path = f"/{SERVICE.full_name}/{method.name}"
        serializer = method.input_type._concrete_class.SerializeToString
        deserializer = method.output_type._concrete_class.FromString
        if method.client_streaming:
            return channel.stream_stream(
                path, request_serializer=serializer, response_deserializer=deserializer
            )
        if method.server_streaming:
            return channel.unary_stream(
                path, request_serializer=serializer, response_deserializer=deserializer
            )
        return channel.unary_unary(
            path, request_serializer=serializer, response_deserializer=deserializer
        )

    def _method(self, method: Any) -> Callable[..., Any]:
        local = getattr(self._messaging, method.name)
        if method.name in LOCAL_METHODS:
            return local  # type: ignore[no-any-return]
        name = method.name

        async def failed(
            context: grpc.aio.ServicerContext, target: str, error: grpc.aio.AioRpcError
        ) -> None:
            code = error.code()
            log.info("%s forwarded to the primary at %s failed: %s", name, target, code)
            await context.abort(code, f"the primary at {target}: {error.details()}")

        if method.client_streaming:

            async def stream_stream(
                requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                target = self._target(context)
                if target is None:
                    async for response in local(requests, context):
                        yield response
                    return
                refusals: list[Any] = []
                malformed: list[StreamRefusal] = []

                async def passed() -> AsyncIterator[Any]:
                    try:
                        async for request in requests:
                            if isinstance(request, Answered):  # refused here by the ACL
                                refusals.append(request.response)
                                continue
                            yield request
                    except StreamRefusal as refusal:
                        # Raised below once the primary has answered what came before (the
                        # call's requests end here; raised into the call, it would cancel it).
                        malformed.append(refusal)

                call = self._callable(target, method)(
                    passed(),
                    metadata=_forwarded_metadata(context, self._replica.options.replica_id),
                    timeout=context.time_remaining(),
                )
                try:
                    async for response in call:
                        while refusals:
                            yield refusals.pop(0)
                        yield response
                except grpc.aio.AioRpcError as error:
                    await failed(context, target, error)
                if malformed:
                    raise malformed[0]

            return stream_stream
        if method.server_streaming:

            async def unary_stream(
                request: Any, context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                target = self._target(context)
                if target is None:
                    async for response in local(request, context):
                        yield response
                    return
                call = self._callable(target, method)(
                    request, metadata=_forwarded_metadata(context, self._replica.options.replica_id), timeout=context.time_remaining()
                )
                try:
                    async for response in call:
                        yield response
                except grpc.aio.AioRpcError as error:
                    await failed(context, target, error)

            return unary_stream

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            target = self._target(context)
            if target is None:
                return await local(request, context)
            call = self._callable(target, method)
            try:
                return await call(
                    request, metadata=_forwarded_metadata(context, self._replica.options.replica_id), timeout=context.time_remaining()
                )
            except grpc.aio.AioRpcError as error:
                await failed(context, target, error)

        return unary_unary

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
