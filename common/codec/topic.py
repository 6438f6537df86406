"""Topic rules (docs/format.md §12, common/topic/TopicValidator.java, 4.9.8).

A valid topic is 1–127 characters from ``[%|a-zA-Z0-9_-]``, so it can never name a path
outside the store: no ``/``, no ``.``, no ``..``.
"""

from __future__ import annotations

import functools
import re

from rmqstore.common.errors import InvalidArgument

TOPIC_LENGTH_MAX = 127
_VALID = re.compile(r"[%|a-zA-Z0-9_-]+")

SYSTEM_TOPICS = frozenset(
    {
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "BenchmarkTest",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    }
)
NOT_ALLOWED_SEND_TOPICS = frozenset(
    {
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    }
)
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
# A consumer group's retry and dead-letter topics (MixAll's prefixes): the writer makes
# %DLQ%<group> itself when a message of the group runs out of deliveries.
GROUP_TOPIC_PREFIXES = ("%RETRY%", "%DLQ%")


def topic_problem(topic: str) -> str | None:
    """Why ``topic`` is invalid, or None if it is valid."""
    if not topic or not topic.strip():
        return "the topic is blank"
    if len(topic) > TOPIC_LENGTH_MAX:
        return f"the topic is {len(topic)} characters; at most {TOPIC_LENGTH_MAX} are allowed"
    if not _VALID.fullmatch(topic):
        return f"the topic {topic!r} contains characters outside [%|a-zA-Z0-9_-]"
    return None


@functools.lru_cache(maxsize=4096)
def cached_topic_problem(topic: str) -> str | None:
    """:func:`topic_problem`, remembered: lookups check the same few topics again and again."""
    return topic_problem(topic)


def is_valid_topic(topic: str) -> bool:
    return topic_problem(topic) is None


def validate_topic(topic: str) -> str:
    problem = topic_problem(topic)
    if problem is not None:
        raise InvalidArgument(problem)
    return topic


def is_system_topic(topic: str) -> bool:
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)


def reserved_topic_problem(topic: str) -> str | None:
    """Why a client's send or route query may not create ``topic``, or None: the system
    topics and the groups' retry and dead-letter topics are the broker's to make. Once
    they exist, they are read (and, but for NOT_ALLOWED_SEND_TOPICS, written) like any topic."""
    if is_system_topic(topic):
        return f"topic {topic} is a reserved system topic name: it is not created on demand"
    if topic.startswith(GROUP_TOPIC_PREFIXES):
        return f"topic {topic} is a consumer group's retry or dead-letter topic: only the writer creates it"
    return None
