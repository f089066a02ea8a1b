"""The bug hunter: random small scenarios, generic monitors, shrinking (issue: find the
review findings without a test that names them)."""
