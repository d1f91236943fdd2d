"""One partition per dataset id; the mirror poller adds them as datasets appear."""

import dagster as dg

datasets_partitions = dg.DynamicPartitionsDefinition(name="datasets")
