"""``amqlite audit``: the Spark audit job, run in this process.

In-process rather than through ``spark-submit``: PySpark's builder starts the
same JVM that spark-submit would (pip's pyspark ships one), the exit code and
output are the job's own with no second Python to find, and ``--master`` still
reaches a cluster in client mode. ``spark-submit spark/audit_job.py`` remains
the way to run the driver on the cluster itself; it takes the same options.
"""

from __future__ import annotations

import click

#: Exit code for an error, the job's own (spark/audit/limits.py EXIT_ERROR); kept
#: here so that a missing pyspark can be reported without importing it.
EXIT_ERROR = 2


@click.command("audit")
@click.option(
    "--store",
    required=True,
    envvar="AMQLITE_STORE",
    help="The store to audit: postgresql://user@host:port/db or sqlite:///path/amqlite.db.",
)
@click.option("--group", default=None, help="Audit one group (default: every group).")
@click.option(
    "--master",
    default=None,
    help="Spark master URL (default: local[*], every core of this machine).",
)
@click.option(
    "--output",
    default=None,
    type=click.Path(file_okay=False),
    help="Directory for summary.json and findings/<type>/ (JSON lines).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON summary, not a table.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress lines on stderr while Spark works (default: when stderr is a terminal).",
)
@click.option(
    "--jdbc-jar",
    default=None,
    type=click.Path(dir_okay=False),
    help="JDBC driver jar (default: Debian's postgresql.jar or sqlite-jdbc.jar).",
)
@click.option(
    "--rows-per-partition",
    default=None,
    type=click.IntRange(min=1),
    help="Rows per JDBC read partition, i.e. per short read transaction.",
)
@click.option(
    "--now",
    "now_ms",
    default=None,
    type=int,
    help="Judge expiry and ages as of this time (ms since the Unix epoch).",
)
def audit(
    store: str,
    group: str | None,
    master: str | None,
    output: str | None,
    as_json: bool,
    progress: bool | None,
    jdbc_jar: str | None,
    rows_per_partition: int | None,
    now_ms: int | None,
) -> None:
    """Prove or disprove that nothing in the store was lost, orphaned or
    duplicated. Exit 0: clean; 1: findings; 2: error."""
    try:
        from spark import audit_job
    except ImportError as exc:  # the ``spark`` extra is not installed
        click.echo(
            f"amqlite audit: error: {exc.name or 'pyspark'} is not installed: "
            "pip install 'amqlite[spark]'",
            err=True,
        )
        click.get_current_context().exit(EXIT_ERROR)
    argv = ["--store", store]
    for flag, value in (
        ("--group", group),
        ("--master", master),
        ("--output", output),
        ("--jdbc-jar", jdbc_jar),
        ("--rows-per-partition", rows_per_partition),
        ("--now", now_ms),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if as_json:
        argv.append("--json")
    if progress is not None:
        argv.append("--progress" if progress else "--no-progress")
    click.get_current_context().exit(audit_job.main(argv))
