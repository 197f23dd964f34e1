"""amqlite: store."""
