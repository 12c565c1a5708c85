# Sourced by scripts/test (which defines `fail`).
# ensure_cloudevents_sdk makes a virtualenv under target/ with the official
# CloudEvents Python SDK and kafka-python, both pinned, which the tests read
# the relay's messages back with (kafka-python is the Kafka tests' client of
# their own, independent of the librdkafka the relay uses), and exports
# OUTBOX_TEST_PYTHON, its python. An existing virtualenv with both pinned
# versions is reused.

CLOUDEVENTS_SDK_VERSION=2.2.0
KAFKA_PYTHON_VERSION=3.0.12

# Prints "cloudevents==X kafka-python==Y" as installed in the virtualenv.
installed_python_pins() {
  "$1" -c 'import importlib.metadata as m; print("cloudevents==" + m.version("cloudevents"), "kafka-python==" + m.version("kafka-python"))' 2>/dev/null
}

ensure_cloudevents_sdk() {
  local venv=target/cloudevents-sdk-venv
  local python=$venv/bin/python
  local pins="cloudevents==$CLOUDEVENTS_SDK_VERSION kafka-python==$KAFKA_PYTHON_VERSION"
  if [ -x "$python" ] && [ "$(installed_python_pins "$python")" = "$pins" ]; then
    export OUTBOX_TEST_PYTHON=$PWD/$python
    return 0
  fi
  command -v python3 >/dev/null 2>&1 ||
    fail "python3 is missing; the CloudEvents and Kafka tests read messages back with the CloudEvents Python SDK and kafka-python (install python3 with its venv module)"
  mkdir -p target
  rm -rf "$venv"
  python3 -m venv "$venv" >target/cloudevents-sdk.log 2>&1 ||
    fail "could not create a virtualenv with python3 -m venv (is the venv module installed?); see target/cloudevents-sdk.log"
  echo "$(basename "$0"): installing $pins into $venv" >&2
  # shellcheck disable=SC2086 # two requirements, split on purpose
  "$python" -m pip install --quiet --disable-pip-version-check $pins >>target/cloudevents-sdk.log 2>&1 ||
    fail "could not install $pins with pip; see target/cloudevents-sdk.log"
  export OUTBOX_TEST_PYTHON=$PWD/$python
}
