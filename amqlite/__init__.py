"""amqlite: amqlite."""
