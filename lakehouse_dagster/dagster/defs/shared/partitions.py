"""One partition per dataset id; the mirror poller adds them as datasets appear."""

import dagster as dg

DATASETS = "datasets"  # the definition's name as a str (DynamicPartitionsDefinition.name is Optional)
datasets_partitions = dg.DynamicPartitionsDefinition(name=DATASETS)
