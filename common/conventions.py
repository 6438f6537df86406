"""The names traced spans carry: OpenTelemetry's messaging semantic conventions and the
property a message's trace context travels in. A module of its own, loading nothing of
OpenTelemetry: the command line names them before it loads the SDK."""

# The property holding the W3C trace context of the producer that sent a message
# ("00-<trace id>-<span id>-<flags>"). rmqstore's client sets it; the RocketMQ 5 gateway
# stores the trace context the official clients send in their system properties under it.
TRACEPARENT = "traceparent"

# OpenTelemetry's messaging semantic conventions (the stable names).
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_OPERATION_NAME = "messaging.operation.name"
MESSAGING_DESTINATION_NAME = "messaging.destination.name"
MESSAGING_MESSAGE_ID = "messaging.message.id"
MESSAGING_BATCH_MESSAGE_COUNT = "messaging.batch.message_count"
MESSAGING_CONSUMER_GROUP_NAME = "messaging.consumer.group.name"
MESSAGING_ROCKETMQ_KEYS = "messaging.rocketmq.message.keys"
MESSAGING_ROCKETMQ_TAG = "messaging.rocketmq.message.tag"
MESSAGING_ROCKETMQ_GROUP = "messaging.rocketmq.message.group"
ROCKETMQ = "rocketmq"
