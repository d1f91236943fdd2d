"""Rollout plans: a reader or writer moved stage by stage, promoted by verdicts, aborted and rolled back on MISMATCH."""
