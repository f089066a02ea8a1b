"""Hydra structured configs (schema), their check-and-build into simulator objects (build),
and the start-up check that turns a bad override into one line and exit code 2 (preflight)."""
