"""HPC Challenge: native, tuned container nodes, ablations, a VM (suite ``hpcc``)."""
