"""What the domains under defs/ share: asset keys, the dataset partitions, run tags, partition metadata, metadata
tables and how a refusal ends a step. Glue like the rest of defs/; no definitions of its own."""
