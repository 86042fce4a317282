#!/bin/bash
# A batch job whose steps run inside an hpvc virtual cluster (README step 7,
# docs/slurm.md). Submit it with the spec beside it:
#   sbatch -N2 --hpvc=slurm.toml job.sh        # or --hpvc=slurm-vm.toml: the steps run in the guests
# Every srun step of the job runs in the job's compute nodes; the output goes
# to slurm-<jobid>.out in the directory sbatch was run in.
set -eu
echo "job $SLURM_JOB_ID on hosts $SLURM_JOB_NODELIST"
srun -N2 -n2 hostname                          # compute0, compute1
srun -N1 -n1 hostname                          # compute0
