"""Slurm integration: the node-level commands the SPANK plugin (native/spank) calls."""
