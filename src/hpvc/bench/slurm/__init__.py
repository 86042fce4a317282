"""What ``srun --hpvc`` costs, on a private Slurm test cluster (``hpvc bench slurm``)."""
