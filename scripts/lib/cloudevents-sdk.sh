# Sourced by scripts/test (which defines `fail`).
# ensure_cloudevents_sdk makes a virtualenv under target/ with the official
# CloudEvents Python SDK, pinned, which the CloudEvents tests read the
# relay's messages back with, and exports OUTBOX_TEST_PYTHON, its python.
# An existing virtualenv with the pinned version is reused.

CLOUDEVENTS_SDK_VERSION=2.2.0

ensure_cloudevents_sdk() {
  local venv=target/cloudevents-sdk-venv
  local python=$venv/bin/python
  if [ -x "$python" ] &&
    [ "$("$python" -c 'import importlib.metadata as m; print(m.version("cloudevents"))' 2>/dev/null)" = "$CLOUDEVENTS_SDK_VERSION" ]; then
    export OUTBOX_TEST_PYTHON=$PWD/$python
    return 0
  fi
  command -v python3 >/dev/null 2>&1 ||
    fail "python3 is missing; the CloudEvents tests read messages back with the CloudEvents Python SDK (install python3 with its venv module)"
  mkdir -p target
  rm -rf "$venv"
  python3 -m venv "$venv" >target/cloudevents-sdk.log 2>&1 ||
    fail "could not create a virtualenv with python3 -m venv (is the venv module installed?); see target/cloudevents-sdk.log"
  echo "$(basename "$0"): installing the CloudEvents SDK (cloudevents==$CLOUDEVENTS_SDK_VERSION) into $venv" >&2
  "$python" -m pip install --quiet --disable-pip-version-check "cloudevents==$CLOUDEVENTS_SDK_VERSION" >>target/cloudevents-sdk.log 2>&1 ||
    fail "could not install cloudevents==$CLOUDEVENTS_SDK_VERSION with pip; see target/cloudevents-sdk.log"
  export OUTBOX_TEST_PYTHON=$PWD/$python
}
