"""amqlite: a highly available STOMP 1.2 broker with shared-store master/slave election."""

__version__ = "0.1.0"
