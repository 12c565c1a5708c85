# syntax=docker/dockerfile:1

# outbox-relay image: the release binary on Debian slim, run as a
# non-root user. Build with `docker build -t outbox-relay .` (BuildKit).
#
# Base images. The builder runs the Rust version the crate declares
# (Cargo.toml rust-version; .ci/deploy-checks keeps the two equal). Both
# bases are pinned by digest once the digests are recorded below: run
# deploy/pin-base-images where a registry is reachable (it resolves the
# tags and writes the digests here), or pass --build-arg
# RUST_IMAGE_DIGEST=sha256:... RUNTIME_IMAGE_DIGEST=sha256:... . Empty, the
# tags alone are used (deploy-checks says so; REQUIRE_PINNED_DIGESTS=1 makes
# that an error, for release builds).
ARG RUST_VERSION=1.89
ARG RUST_IMAGE_DIGEST=
ARG RUNTIME_IMAGE_DIGEST=

# --- build -----------------------------------------------------------------
# Bookworm, like the runtime base below: the binary links against the glibc
# of the image it is built in, so the two Debian releases must match.
FROM rust:${RUST_VERSION}-slim-bookworm${RUST_IMAGE_DIGEST:+@${RUST_IMAGE_DIGEST}} AS build
# The Kafka sink compiles librdkafka from its C source: its configure script
# wants a C++ compiler (g++) besides the image's gcc, then make; pkg-config
# and the OpenSSL headers let it and openssl-sys find OpenSSL, which the
# binary links dynamically (libssl3 in the runtime image). zstd and zlib are
# compiled from source by their crates. Not pinned, like ca-certificates
# below: the base image (its tag, and its digest once pinned) is what pins.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ make pkg-config libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The crate registry and target/ live in BuildKit cache mounts, so a rebuild
# after a source change recompiles only the crate, not its dependencies.
# target/ is not part of the image layer, hence the copy out of it in the
# same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin outbox-relay \
 && install -D -m 0755 target/release/outbox-relay /out/outbox-relay

# --- runtime ---------------------------------------------------------------
# Debian slim of the same release as the builder (glibc must match), plus CA
# certificates for SQS and TLS brokers, and OpenSSL 3 (libssl3: libssl.so.3
# and libcrypto.so.3), which librdkafka, the Kafka sink's client, links
# dynamically for TLS and SCRAM; nothing else is installed. (A distroless
# "cc" Debian 12 base carries the same glibc, libssl3 and CA certificates
# without a shell or apt: docs/deployment.md, "Image", says why it is not
# the default yet.)
FROM debian:bookworm-slim${RUNTIME_IMAGE_DIGEST:+@${RUNTIME_IMAGE_DIGEST}}
# Not pinned: Debian replaces old versions in its archive, so a pin would
# break the build; the base image (tag and digest) is what pins.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin nonroot
LABEL org.opencontainers.image.title="outbox-relay" \
      org.opencontainers.image.description="Publishes PostgreSQL outbox rows to RabbitMQ, Amazon SQS, NATS JetStream or Kafka, at least once" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/outbox-relay /usr/local/bin/outbox-relay
# Numeric, so that Kubernetes' runAsNonRoot can verify it without a passwd
# lookup; the Helm chart runs as the same uid.
USER 65532:65532
# /metrics, /healthz and /readyz (OUTBOX_HTTP_ADDR, default 0.0.0.0:9090).
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/outbox-relay"]
CMD ["run"]
