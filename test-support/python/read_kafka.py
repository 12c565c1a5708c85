"""Reads every record of a Kafka topic with kafka-python, a client of its
own (not librdkafka, which the relay uses), so that a test sees what any
consumer would, not what the relay's client agrees with itself about.

Usage: read_kafka.py [--cloudevents] BOOTSTRAP TOPIC

Every partition of TOPIC is assigned and read from its beginning to the end
offset it had when the read started. A topic that does not exist reads as
empty, and is never created by reading it (the relay must not find a topic
a test did not create).

Output, on stdout, one JSON object per record, by partition then offset:
  {"partition": 0, "offset": 0, "key": B64 | null, "value": B64 | null,
   "headers": [[NAME, B64], ...]}
With --cloudevents, each record is parsed as a binary-mode CloudEvent by
the official SDK (cloudevents.core.bindings.kafka.from_binary), and the
object has instead
  {"partition": .., "offset": .., "ok": true, "attributes": {...}, "data": ...}
with every attribute as a string (time in ISO 8601), or
  {"partition": .., "offset": .., "ok": false, "error": "..."}
when the SDK refused it.

Exits 0 once everything is printed, 1 (with the reason on stderr) when the
cluster does not answer or the end offsets are not reached within 30 s.
"""

import base64
import json
import sys
import time

from kafka import KafkaConsumer, TopicPartition

DEADLINE_SECONDS = 30


def b64(data):
    return None if data is None else base64.b64encode(data).decode("ascii")


def as_cloudevent(record):
    # Imported here: the plain mode needs only kafka-python.
    from cloudevents.core.bindings import kafka
    from cloudevents.core.formats.json import JSONFormat

    message = kafka.KafkaMessage(
        headers={name: value for name, value in record.headers},
        key=record.key,
        value=record.value,
    )
    event = kafka.from_binary(message, JSONFormat())
    attributes = {}
    for name, value in event.get_attributes().items():
        attributes[name] = value.isoformat() if hasattr(value, "isoformat") else str(value)
    return {"attributes": attributes, "data": event.get_data()}


def main():
    args = sys.argv[1:]
    cloudevents = "--cloudevents" in args
    args = [arg for arg in args if arg != "--cloudevents"]
    if len(args) != 2:
        sys.exit("usage: read_kafka.py [--cloudevents] BOOTSTRAP TOPIC")
    bootstrap, topic = args
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap.split(","),
        group_id=None,
        enable_auto_commit=False,
        allow_auto_create_topics=False,
        client_id="outbox-tests-reader",
        # librdkafka's mock cluster answers ApiVersions up to v2 only, and
        # kafka-python cannot decode the v0-shaped refusal of the v3/v4 it
        # probes with; fixing the protocol level (Kafka 2.1: record headers,
        # Fetch v10) skips the probe.
        api_version=(2, 1),
        request_timeout_ms=10_000,
    )
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        if not partitions:
            return
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        records = {tp: [] for tp in partitions}
        deadline = time.monotonic() + DEADLINE_SECONDS
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            if time.monotonic() > deadline:
                positions = {tp.partition: (consumer.position(tp), ends[tp]) for tp in partitions}
                sys.exit(f"read_kafka.py: end offsets not reached in {DEADLINE_SECONDS} s: {positions}")
            for tp, batch in consumer.poll(timeout_ms=500).items():
                records[tp].extend(r for r in batch if r.offset < ends[tp])
        for tp in partitions:
            for record in records[tp]:
                line = {"partition": record.partition, "offset": record.offset}
                if cloudevents:
                    try:
                        line.update(ok=True, **as_cloudevent(record))
                    except Exception as error:  # the SDK's refusal, reported to the test
                        line.update(ok=False, error=f"{type(error).__name__}: {error}")
                else:
                    line.update(
                        key=b64(record.key),
                        value=b64(record.value),
                        headers=[[name, b64(value)] for name, value in record.headers],
                    )
                print(json.dumps(line))
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
