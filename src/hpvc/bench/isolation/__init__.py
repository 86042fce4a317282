"""An HPC workload beside a CPU-hungry tenant: idle, partitioned, shared (suite ``isolation``)."""
