"""The project's Postgres schema: the migration runner and the migrations it applies."""
