"""amqlite: spark."""
