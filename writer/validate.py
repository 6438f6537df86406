"""The writer's checks of a batch: a request's, or several callers' taken together into
one group commit, by the rules of :mod:`rmqstore.common.message_rules` (re-exported here
for the writer's modules)."""

from __future__ import annotations

from collections.abc import Sequence

from rmqstore.common.errors import InvalidArgument
from rmqstore.common.message_rules import DEFAULT_LIMITS as DEFAULT_LIMITS
from rmqstore.common.message_rules import EMPTY_PROPERTIES as EMPTY_PROPERTIES
from rmqstore.common.message_rules import RESERVED_PROPERTIES as RESERVED_PROPERTIES
from rmqstore.common.message_rules import SCHEDULING_PROPERTIES as SCHEDULING_PROPERTIES
from rmqstore.common.message_rules import UNIQ_KEY_LENGTH_MAX as UNIQ_KEY_LENGTH_MAX
from rmqstore.common.message_rules import Limits as Limits
from rmqstore.common.message_rules import MessageBatch as MessageBatch
from rmqstore.common.message_rules import MessageInput as MessageInput
from rmqstore.common.message_rules import plainly_valid, validate_message


def validate_batch(batch: MessageBatch | Sequence[MessageInput], limits: Limits) -> None:
    """Check a batch; raise for the first bad message (numbered from 1 in a batch)."""
    if not isinstance(batch, MessageBatch):
        batch = MessageBatch.of(batch)
    count = batch.message_count
    if not count:
        raise InvalidArgument("the batch is empty")
    if count > limits.max_batch_messages:
        raise InvalidArgument(f"the batch has {count} messages; at most {limits.max_batch_messages}")
    if not plainly_valid(batch, limits):
        for i in range(count):
            validate_message(batch.message(i), limits, i + 1 if count > 1 else 0)


def validate_parts(batch: MessageBatch, counts: Sequence[int], limits: Limits) -> list[InvalidArgument | None]:
    """:func:`validate_batch` for several callers' batches given as one (``batch``, their
    messages in order, ``counts`` of them each): each caller's error, or None. One screen
    of the whole when every part passes; only otherwise is each part checked on its own,
    its messages numbered within it."""
    if all(0 < count <= limits.max_batch_messages for count in counts) and plainly_valid(batch, limits):
        return [None] * len(counts)
    problems: list[InvalidArgument | None] = []
    start = 0
    for count in counts:
        try:
            validate_batch(batch.slice(start, start + count), limits)
        except InvalidArgument as error:
            problems.append(error)
        else:
            problems.append(None)
        start += count
    return problems
