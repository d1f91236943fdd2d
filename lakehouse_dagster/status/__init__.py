"""The migration as it is, for the operator: each dataset's stage, the overview counts, what needs attention, alerts."""
