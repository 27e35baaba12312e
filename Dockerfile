# Builds the `quiver` binary (registry, worker, CLI) into a slim runtime image.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p quiver \
 && install -Dm755 target/release/quiver /out/quiver

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home /var/lib/quiver --create-home quiver
COPY --from=build /out/quiver /usr/local/bin/quiver
COPY config /etc/quiver
USER quiver
WORKDIR /var/lib/quiver
EXPOSE 50051 8080
ENTRYPOINT ["quiver"]
CMD ["registry", "--config", "/etc/quiver/registry.toml"]
