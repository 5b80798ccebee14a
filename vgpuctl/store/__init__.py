"""Everything that touches SQLite: the jobs table, the usage table and the
read-only view reports use, with retention. No other package imports
sqlite3 (checked by tests/unit/test_layers.py)."""
