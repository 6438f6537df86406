"""Messages as a columnar request's columns, field for field (MessageColumns' contract),
whatever the writer makes of them: for the tests that compare what the writer stores from
``columns`` with what it stores from ``messages``, and for benchmarks/intake_probe.py.
The client's own builder (rmqstore.client.columns) leaves out what the writer would
read otherwise, which these tests need to send."""

from __future__ import annotations

from collections.abc import Sequence

from rmqstore.v1 import messages_pb2, writer_pb2


def as_columns_of(messages: Sequence[messages_pb2.Message]) -> writer_pb2.MessageColumns:
    """``messages`` as a columnar request's columns (a message without a queue id: -1,
    the writer picks)."""
    properties = [list(m.properties.items()) for m in messages]
    return writer_pb2.MessageColumns(
        bodies=[m.body for m in messages],
        topics=[m.topic for m in messages],
        queue_ids=[m.queue_id if m.HasField("queue_id") else -1 for m in messages],
        keys=[" ".join(m.keys) for m in messages],
        tags=[m.tags for m in messages],
        uniq_keys=[m.uniq_key for m in messages],
        flags=[m.flag for m in messages],
        born_timestamps_ms=[m.born_timestamp_ms for m in messages],
        born_hosts=[m.born_host for m in messages],
        property_counts=[len(p) for p in properties],
        property_names=[name for p in properties for name, _ in p],
        property_values=[value for p in properties for _, value in p],
    )
