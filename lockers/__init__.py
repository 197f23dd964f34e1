"""amqlite: lockers."""
