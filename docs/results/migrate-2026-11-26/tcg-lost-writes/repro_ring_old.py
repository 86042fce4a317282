"""The same reproduction with the live copy hpvc did before (no stop)."""
import runpy, sys
from hpvc.backends.vm import migration
migration.live_copy_loses_writes = lambda *a: False
sys.argv = ["repro_ring.py", *sys.argv[1:]]
runpy.run_path("/tmp/rr/repro_ring.py", run_name="__main__")
