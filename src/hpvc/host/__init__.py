"""Everything that reads or changes the host, each change with its undo; probes read only."""
