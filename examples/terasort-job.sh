#!/bin/bash
# TeraSort (generate, sort, validate) as a Slurm job on a Spark virtual
# cluster (README, docs/slurm.md "Spark and NFS under Slurm"):
#   sbatch -N3 --mem=3G --hpvc=spark-slurm.toml terasort-job.sh [ROWS]
# ROWS 100-byte records (default 100000: 10 MB). The first step runs on every
# host, so each host's share (NFS mount, Spark worker) comes up before the
# driver starts; the driver then runs in compute0 as the job's user, and the
# data lives on the job's shared directory (/shared, NFS from head0).
set -eu
rows=${1:-100000}
srun -N "$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 hostname   # brings every share up
dir=/shared/terasort-$SLURM_JOB_ID
# One application for the three, so the driver and executors start once:
# generate into $dir/in, sort into $dir/out, validate $dir/out.
srun -N1 -n1 env JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
  /opt/spark/bin/spark-submit --master spark://head0:7077 --deploy-mode client \
  --driver-memory 512m --conf spark.executor.memory=512m \
  --conf spark.local.dir=/tmp --class hpvc.terasort.TeraSort /opt/hpvc/terasort.jar \
  all "$rows" "$dir"
