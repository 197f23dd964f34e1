"""The amqlite store audit: proves, or disproves, that nothing was lost, orphaned
or duplicated in a shared store, by reading it through Spark's JDBC source.

Standard library + pyspark, and psycopg when installed (the driver then runs
the statements pushed into PostgreSQL itself, ``pool``). ``spark/audit_job.py`` is the entry point
(``spark-submit spark/audit_job.py --store URL ...``); the ``amqlite audit``
command calls :func:`spark.audit.run.main` in-process. Executors run no Python of
this package: every check is Spark SQL (JVM expressions), so only the driver
imports it.

The rooms: ``limits`` (numbers, findings, store columns), ``source`` (store URL,
driver jar, reachability), ``session`` (Spark session, progress, settings),
``snapshot``, ``reader`` (JDBC reads), ``checks`` (run by Spark),
``store_checks`` (pushed into PostgreSQL), ``pool`` (the driver's connections
that run them), ``data`` (what is read, all findings),
``report`` (summary, files, table), ``run`` (``run_audit``, ``main``).

Every read sees one snapshot of the store (``Snapshot``): on PostgreSQL the
driver's transaction exports it and every JDBC partition imports it; SQLite is
copied with the backup API in one read transaction and the copy is read. What a
live broker commits meanwhile (sends, acknowledgements, the dedup pruner) is
then wholly in the audit's view or not at all, so the checks see a state the
store really was in, and every invariant the store keeps per transaction holds.

Reads scale with the rows of the audited groups: every partition names its group
(an index on (grp, ...) is walked only within it), big groups are cut at
quantiles of the key (``StoreReader.key_predicates``), never at min/max strides.

On PostgreSQL the per-row work runs in the store, in the same snapshot, as
statements the driver runs on a few connections of its own while the JVM starts
(Spark's partitions when psycopg is missing or a read returns too much), and
only rows at fault and per-slice summaries come back: the checks an index
answers (orphans, expiry, dedup expiry) in one statement; duplicates by
identity and content per group (a group's candidates are all in its statement,
which judges them; a big group in hash classes); per slice of the big tables,
runs of producer sequence numbers and stale in-flight rows. Spark merges
what crosses partitions: the runs into sequence gaps (per producer and
bucket of numbers), then the counts, samples and files. On SQLite (no sha256, a
local file) every row is read and Spark runs the same checks itself.

Dedup entries past their window are judged against the group's last recorded
prune (``amq_meta``, ``DEDUP_PRUNED_PREFIX``): housekeeping that has not run yet
(a stopped broker) is reported as pending, not as a finding.
"""
