"""End-to-end tests: real `amqlite` broker processes driven by the real stomp.py client."""
