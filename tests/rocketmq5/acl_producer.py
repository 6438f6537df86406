"""The official RocketMQ 5 Python client with credentials, as a user configures it: one
producer signed with ACCESS_KEY and SECRET_KEY sends one message to each TOPIC in turn.
Each outcome is one JSON line on stdout: the receipt, or the exception the client raised
(its class and text, as an application would see them). ``--tls``: the client's TLS on
(trusting the CA that GRPC_DEFAULT_SSL_ROOTS_FILE_PATH names).

    python acl_producer.py [--tls] ENDPOINT ACCESS_KEY SECRET_KEY TOPIC [TOPIC ...]"""

from __future__ import annotations

import json
import sys

from rocketmq import ClientConfiguration, Credentials, Message, Producer


def main() -> None:
    arguments = sys.argv[1:]
    tls = arguments[:1] == ["--tls"]
    endpoint, access_key, secret_key, *topics = arguments[1:] if tls else arguments
    producer = Producer(ClientConfiguration(endpoint, Credentials(access_key, secret_key), request_timeout=5), tls_enable=tls)
    producer.startup()
    try:
        for topic in topics:
            message = Message()
            message.topic = topic
            message.body = f"signed message to {topic}".encode()
            message.keys = f"acl-{topic}"
            try:
                receipt = producer.send(message)
            except Exception as error:  # what the application is handed, reported as is
                line = {"topic": topic, "error": type(error).__name__, "message": str(error)}
            else:
                line = {"topic": topic, "message_id": receipt.message_id, "offset": receipt.offset}
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()
    finally:
        producer.shutdown()


if __name__ == "__main__":
    main()
