# Sourced by scripts/test (which defines `fail`).
# ensure_test_servers installs what the connectivity tests start themselves
# when it is missing: PgBouncer (transaction pooling in front of PostgreSQL)
# and stunnel (TLS in front of RabbitMQ), from Debian's packages. The tests
# run them on ports of their own; the packages' own services stay stopped.

ensure_test_servers() {
  local missing=()
  command -v pgbouncer >/dev/null 2>&1 || missing+=(pgbouncer)
  command -v stunnel4 >/dev/null 2>&1 || command -v stunnel >/dev/null 2>&1 || missing+=(stunnel4)
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 ||
    fail "${missing[*]} missing and no apt-get to install them; install them, or run only the tests that do not need them"
  local as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo -n)
  echo "$(basename "$0"): installing ${missing[*]} with apt-get" >&2
  # The packages' maintainer scripts would start their services (PgBouncer
  # on 6432): deny service starts during the install with a policy-rc.d of
  # our own, unless the machine already has one (then left alone).
  local policy=/usr/sbin/policy-rc.d own_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | "${as_root[@]}" tee "$policy" >/dev/null
    "${as_root[@]}" chmod 0755 "$policy"
    own_policy=1
  fi
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}")
  mkdir -p target
  if ! "${as_root[@]}" "${apt[@]}" >target/apt-test-servers.log 2>&1; then
    # A fresh machine may have no package lists yet.
    "${as_root[@]}" apt-get update -q >>target/apt-test-servers.log 2>&1 || true
    if ! "${as_root[@]}" "${apt[@]}" >>target/apt-test-servers.log 2>&1; then
      [ -n "$own_policy" ] && "${as_root[@]}" rm -f "$policy"
      fail "could not install ${missing[*]}; see target/apt-test-servers.log"
    fi
  fi
  [ -n "$own_policy" ] && "${as_root[@]}" rm -f "$policy"
  return 0
}
