"""The demo workspace (workspace.py): datasets of several sizes and shapes, seeded into the app tables once."""
