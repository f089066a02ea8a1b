"""Runnable experiment entry points (``python -m experiments.<name> key=value ...``)."""
