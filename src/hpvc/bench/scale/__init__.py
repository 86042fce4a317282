"""How hpvc's costs grow with hosts and nodes (issue 33, docs/benchmarks.md "Scale").

``slurm``: time to the first task, epilog and per-host cost of ``srun -N<h>
--hpvc`` against plain ``srun`` on the Slurm test cluster; ``planner``: the
planner on simulated inventories. ``hpvc bench scale`` runs both.
"""
