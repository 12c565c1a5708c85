# Sourced by scripts/test and .ci/run (which define `fail` or not).
# ensure_build_deps installs, from Debian's packages, what the build needs
# beyond the Rust toolchain when it is missing: the Kafka sink compiles
# librdkafka from its bundled source (C and C++: its configure script
# fails without a C++ compiler) with make, against the OpenSSL and zlib
# headers, found with pkg-config.

ensure_build_deps() {
  local missing=()
  command -v cc >/dev/null 2>&1 || missing+=(gcc)
  command -v c++ >/dev/null 2>&1 || missing+=(g++)
  command -v make >/dev/null 2>&1 || missing+=(make)
  command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
  if command -v pkg-config >/dev/null 2>&1; then
    pkg-config --exists openssl || missing+=(libssl-dev)
    pkg-config --exists zlib || missing+=(zlib1g-dev)
  else
    missing+=(libssl-dev zlib1g-dev)
  fi
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing the build's C dependencies: ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"; } >/dev/null; then
    echo "could not install ${missing[*]} with apt-get; install them by hand (librdkafka, for the Kafka sink, needs them)" >&2
    return 1
  fi
}
