"""``hpvc bench pmix``: MPI launched by Slurm (``srun --mpi=pmix``) against
``mpirun`` inside the same virtual nodes, and the step launch time of
``srun --mpi=pmix --hpvc`` against plain ``srun --mpi=pmix`` (issue 30, Figures)."""
