"""Reads messages the relay sent in CloudEvents mode with the official
CloudEvents Python SDK (the `cloudevents` package, 2.x), as a consumer
would, and prints what the SDK made of each.

Input, on stdin: one JSON object per line, either
  {"mode": "rabbitmq", "headers": {...}, "content_type": "...", "body": "..."}
for a RabbitMQ message (binary content mode), or
  {"mode": "json", "body": "..."}
for an SQS message body (structured content mode, the JSON format).

Output, on stdout: one JSON object per input line, in order:
  {"ok": true, "attributes": {...}, "data": ...}
with every attribute as a string (time in ISO 8601), or
  {"ok": false, "error": "..."}
when the SDK refused the message. The test asserts on these.
"""

import json
import sys

from cloudevents.core.bindings import rabbitmq
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent


def read(message):
    if message["mode"] == "rabbitmq":
        wire = rabbitmq.RabbitMQMessage(
            headers=message["headers"],
            content_type=message["content_type"],
            body=message["body"].encode("utf-8"),
        )
        # Binary content mode only: a message that is not in it must fail here.
        if (message["content_type"] or "").lower().startswith("application/cloudevents"):
            raise ValueError("content_type says structured mode, expected binary")
        return rabbitmq.from_binary(wire, JSONFormat(), CloudEvent)
    if message["mode"] == "json":
        return JSONFormat().read(CloudEvent, message["body"].encode("utf-8"))
    raise ValueError(f"unknown mode {message['mode']!r}")


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            event = read(json.loads(line))
            attributes = {}
            for name, value in event.get_attributes().items():
                attributes[name] = value.isoformat() if hasattr(value, "isoformat") else str(value)
            result = {"ok": True, "attributes": attributes, "data": event.get_data()}
        except Exception as error:  # the SDK's validation errors, reported to the test
            result = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
