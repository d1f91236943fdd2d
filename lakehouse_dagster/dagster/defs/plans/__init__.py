"""Rollout plans: the rollout_controller sensor, the rollout_* jobs."""
