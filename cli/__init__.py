"""amqlite: cli."""
