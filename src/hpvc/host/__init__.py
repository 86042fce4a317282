"""Everything that reads or changes the host, each change with its undo; probes read only."""

from hpvc.host import pyroute

pyroute.install()  # pyroute2 without its package __init__ (hpvc.host.pyroute says why)
