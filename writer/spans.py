"""The writer's span of a group of requests: one ``rmqstore.append`` span covering the
group's append to the commit log and its dispatch to the consume queues and index.

One span a group, not one per step: each span the SDK makes costs the event loop time,
paid once per group of requests (benchmarks/TRACING.md). The span carries the
group's messaging attributes, a link to each distinct producer context its messages
carry (their ``traceparent`` property), and an event ``rmqstore.dispatch`` where the
dispatch begins. It is a child of the current span (the first request's server span)
and is sampled by the installed provider's sampler."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import trace

from rmqstore.common.conventions import (
    MESSAGING_BATCH_MESSAGE_COUNT,
    MESSAGING_DESTINATION_NAME,
    MESSAGING_MESSAGE_ID,
    MESSAGING_SYSTEM,
    ROCKETMQ,
)
from rmqstore.common.sequences import all_equal
from rmqstore.common.tracing import LeafSpan, leaf_span, links_from_messages, tracing_on
from rmqstore.writer.validate import MessageBatch

_TRACER = trace.get_tracer("rmqstore.writer")

DISPATCH_EVENT = "rmqstore.dispatch"


def append_span(batch: MessageBatch) -> AbstractContextManager[LeafSpan]:
    """The span of ``batch``'s append and dispatch (a group of requests as one batch);
    nothing while tracing is off."""
    if not tracing_on():
        return nullcontext(trace.INVALID_SPAN)
    return leaf_span(_TRACER, "rmqstore.append", _messaging_attributes(batch), links_from_messages(batch.properties))


def dispatching(span: LeafSpan, uniq_keys: list[str]) -> None:
    """Mark on ``span`` that the group's records are appended (``uniq_keys``, one a
    message) and their dispatch begins."""
    if len(uniq_keys) == 1:
        span.set_attribute(MESSAGING_MESSAGE_ID, uniq_keys[0])
    span.add_event(DISPATCH_EVENT)


def _messaging_attributes(batch: MessageBatch) -> dict[str, Any]:
    """The messaging attributes: the topic when the batch has one, the count when it has
    more than one message. Few on purpose: the SDK checks every attribute value, a cost
    paid per group of requests (the client's span has a message's keys and tag)."""
    attributes: dict[str, Any] = {MESSAGING_SYSTEM: ROCKETMQ}
    topics = batch.topics
    if all_equal(topics):
        attributes[MESSAGING_DESTINATION_NAME] = topics[0]
    if batch.message_count != 1:
        attributes[MESSAGING_BATCH_MESSAGE_COUNT] = batch.message_count
    return attributes
