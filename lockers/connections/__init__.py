"""amqlite: lockers.connections — the floor shared by the store, the lockers and the registry.

How amqlite reaches its PostgreSQL and ZooKeeper servers and reports what went wrong,
in one place so every user connects, retries and words its errors alike:

* ``postgres``: libpq and session tuning of the lock session and the store pool, side by side;
* ``pg_url``: PostgreSQL URLs as libpq reads them, one host or several, checked;
* ``zookeeper``: zk:// URLs, kazoo clients and their stop;
* ``blocking``: ``run_blocking``, a blocking call on a thread of its own, awaited on the loop;
* ``errors``: ``one_line``, an exception as the one line a log or a CLI error shows.

It sits inside ``lockers`` because the dependency arrows point down (cli -> amqlite ->
store/lockers, and store -> lockers): the lockers, the store and ``amqlite.registry``
all import it, while it imports nothing of amqlite's, the store's or the other lockers
modules (kazoo only when a ZooKeeper client is made).
"""
