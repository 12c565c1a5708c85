# Sourced by scripts/test and scripts/bench (which define `fail`).
# ensure_sqs_emulator http://127.0.0.1:PORT makes sure an SQS emulator
# answers there, installing and starting moto when none does; a moto started
# here is stopped when the calling script exits. A caller that sets an EXIT
# trap of its own replaces this one, so its trap must call
# stop_sqs_emulator too.

ensure_sqs_emulator() {
  local endpoint=$1 port=${1##*:}
  started_sqs=""
  if curl -fsS -o /dev/null "${endpoint}/moto-api/" 2>/dev/null; then
    return 0
  fi
  if ! command -v moto_server >/dev/null 2>&1; then
    echo "$(basename "$0"): installing the SQS emulator (moto[server]) with pip" >&2
    python3 -m pip install --quiet --disable-pip-version-check 'moto[server]>=5,<6' ||
      fail "could not install moto[server] with pip"
  fi
  mkdir -p target
  moto_server -H 127.0.0.1 -p "$port" >target/moto_server.log 2>&1 &
  started_sqs=$!
  trap stop_sqs_emulator EXIT
  for _ in $(seq 1 100); do
    curl -fsS -o /dev/null "${endpoint}/moto-api/" 2>/dev/null && return 0
    sleep 0.2
  done
  fail "moto_server did not start on port $port; see target/moto_server.log"
}

stop_sqs_emulator() {
  if [ -n "${started_sqs:-}" ]; then
    kill "$started_sqs" 2>/dev/null || true
  fi
}
