"""The writer's consumer group configuration, in Apache RocketMQ 5's
``config/subscriptionGroup.json`` (common/files/broker_config.py).

rmqstore acts on one field, ``consumeMessageOrderly``: an orderly group consumes FIFO (as
Apache's proxy serves a group configured orderly). Every other field, and groups made by
Apache's broker, are kept as read.
"""

from __future__ import annotations

import threading

from rmqstore.common.files import broker_config
from rmqstore.common.files.broker_config import Entry


class SubscriptionGroupTable:
    def __init__(self, config_dir: str):
        self.config_dir = config_dir
        self._lock = threading.Lock()
        read = broker_config.read_table(config_dir, broker_config.GROUPS_FILE_NAME, broker_config.GROUPS_TABLE, "groupName")
        self.configs: dict[str, Entry]
        self.document: Entry
        self.configs, self.document = read if read is not None else ({}, {"forbiddenTable": {}})
        self.orderly: frozenset[str] = frozenset(n for n, e in self.configs.items() if broker_config.group_orderly(e))

    def update(self, group: str, consume_orderly: bool | None) -> tuple[Entry, bool]:
        """Create the group's configuration or change its orderliness (None: leave it);
        returns the configuration and whether anything changed."""
        with self._lock:
            previous = self.configs.get(group)
            entry = dict(previous or broker_config.new_group_config(group))
            if consume_orderly is not None:
                entry["consumeMessageOrderly"] = consume_orderly
            if previous is not None and entry == previous:
                return entry, False
            document = dict(self.document)
            document[broker_config.GROUPS_TABLE] = dict(sorted({**self.configs, group: entry}.items()))
            document["dataVersion"] = broker_config.next_data_version(self.document)
            broker_config.write_table(self.config_dir, broker_config.GROUPS_FILE_NAME, document)
            self.document = document
            self.configs[group] = entry
            self.orderly = frozenset(n for n, e in self.configs.items() if broker_config.group_orderly(e))
            return entry, True
