# The amqlite images. Two targets:
#   broker (default for the brokers): `amqlite start`, settings from AMQLITE_* variables;
#   audit: the broker image plus Java 17, the PostgreSQL JDBC driver and PySpark, for
#          `amqlite audit`.
# docker compose builds both (see docker-compose.yml); by hand:
#   docker build --target broker -t amqlite .
#   docker build --target audit -t amqlite-audit .

FROM python:3.11-slim AS broker
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AMQLITE_DATA_DIR=/var/lib/amqlite
WORKDIR /src
COPY pyproject.toml README.md ./
COPY amqlite ./amqlite
COPY lockers ./lockers
COPY store ./store
COPY cli ./cli
COPY spark ./spark
# An unprivileged user; its home is the data directory (the embedded store, if used).
RUN pip install . \
    && useradd --system --uid 10001 --home-dir /var/lib/amqlite --create-home amqlite
USER amqlite
WORKDIR /var/lib/amqlite
EXPOSE 61613
# SIGTERM is a graceful stop: finish the group commit, release the lock at once.
STOPSIGNAL SIGTERM
# Healthy while the process serves its management API (master or slave: /healthz);
# /readyz tells the master apart. The API stays on the container's loopback (8161 is
# the port derived from STOMP's 61613) unless http_bind and a users file say otherwise.
HEALTHCHECK --interval=5s --timeout=5s --start-period=10s --retries=6 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8161/healthz', timeout=4)"]
# Inside a container the broker must listen beyond loopback; publish the port on the
# host's loopback (see docker-compose.yml) to keep it private.
CMD ["amqlite", "start", "--bind", "0.0.0.0:61613"]

FROM broker AS audit
USER root
# Java 17 for PySpark 4, and Debian's /usr/share/java/postgresql.jar (the audit's default
# JDBC driver).
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
       libpostgresql-jdbc-java \
    && rm -rf /var/lib/apt/lists/* \
    && pip install "/src[spark]" \
    && mkdir -p /reports && chown amqlite /reports
USER amqlite
CMD ["amqlite", "audit", "--help"]
