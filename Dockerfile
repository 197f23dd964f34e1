# The amqlite images. Two targets:
#   broker (default for the brokers): `amqlite start`, settings from AMQLITE_* variables;
#   audit: the broker image plus Java 17, the PostgreSQL JDBC driver and PySpark, for
#          `amqlite audit`.
# docker compose builds both (see docker-compose.yml); by hand:
#   docker build --target broker -t amqlite .
#   docker build --target audit -t amqlite-audit .

# The Debian release is pinned: `python:3.11-slim` moved to Debian 13, which has no
# openjdk-17-jre-headless for the audit target (PySpark 4 wants Java 17).
FROM python:3.11-slim-bookworm AS broker
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
# amqlite/management/openapi.yaml (the API's description, package data) links to it.
COPY docs/openapi.yaml ./docs/openapi.yaml
# An unprivileged user; its home is the data directory (the embedded store, if used).
RUN pip install . \
    && useradd --system --uid 10001 --home-dir /var/lib/amqlite --create-home amqlite
USER amqlite
WORKDIR /var/lib/amqlite
EXPOSE 61613
# SIGTERM is a graceful stop: finish the group commit, release the lock at once.
STOPSIGNAL SIGTERM
# The management API on the container's loopback, at a fixed address so the health
# check knows where to ask (a users file and http_allow_remote to expose it).
ENV AMQLITE_HTTP_BIND=127.0.0.1:8161
# Healthy while the process serves its management API (master or slave: /healthz
# answers 200 for both; /readyz tells the master apart). urlopen raises, so the
# check fails, on a refused connection or an HTTP error.
HEALTHCHECK --interval=5s --timeout=5s --start-period=10s --retries=6 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://' + os.environ.get('AMQLITE_HTTP_BIND', '127.0.0.1:8161') + '/healthz', timeout=4)"]
# Inside a container the broker must listen beyond loopback; publish the port on the
# host's loopback (see docker-compose.yml) to keep it private. Without a users file
# (AMQLITE_USERS_FILE) that start is refused unless AMQLITE_ALLOW_ANONYMOUS_REMOTE=true.
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
