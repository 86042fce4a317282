"""hpcc's input: ``hpccinf.txt``, the HPL process grid, and the problem size N.

hpcc sizes STREAM, RandomAccess and FFT from the HPL N (together they use about
the memory of the HPL matrix), so N is chosen for a matrix of ``MATRIX_MIB``
and at least ``LLC_FACTOR`` times the last-level cache: on a 2-CPU EPYC VM
(32 MiB L3) N = 4096, a native run of about 22 s. Under TCG a VM is 10-50x
slower, so it gets ``VM_TCG_N`` instead, and its figures are not comparable
with native (no ratios) unless the accelerator is KVM. Pure: no file, no host.
"""

from __future__ import annotations

import math

NB = 128
MATRIX_MIB = 128  # HPL matrix of all ranks: ~22 s native with 2 ranks on a 2-CPU EPYC VM
LLC_FACTOR = 4  # the matrix (and so the STREAM arrays) at least 4x the last-level cache
VM_TCG_N = 1000  # ~1 s native; a VM under TCG is 10-50x slower
MIN_NODE_MIB = 512


def grid(procs: int) -> tuple[int, int]:
    """HPL's process grid P x Q = procs, as square as it gets, P <= Q."""
    p = max(d for d in range(1, math.isqrt(procs) + 1) if procs % d == 0)
    return p, procs // p


def input_text(n: int, nb: int, p: int, q: int) -> str:
    """``hpccinf.txt``: HPL.dat (one N, NB and grid) and hpcc's PTRANS lines."""
    lines = [
        "HPLinpack benchmark input file",
        "Innovative Computing Laboratory, University of Tennessee",
        "HPL.out      output file name (if any)",
        "8            device out (6=stdout,7=stderr,file)",
        "1            # of problems sizes (N)",
        f"{n:<12} Ns",
        "1            # of NBs",
        f"{nb:<12} NBs",
        "0            PMAP process mapping (0=Row-,1=Column-major)",
        "1            # of process grids (P x Q)",
        f"{p:<12} Ps",
        f"{q:<12} Qs",
        "16.0         threshold",
        "1            # of panel fact",
        "2            PFACTs (0=left, 1=Crout, 2=Right)",
        "1            # of recursive stopping criterium",
        "4            NBMINs (>= 1)",
        "1            # of panels in recursion",
        "2            NDIVs",
        "1            # of recursive panel fact.",
        "1            RFACTs (0=left, 1=Crout, 2=Right)",
        "1            # of broadcast",
        "1            BCASTs (0=1rg,1=1rM,2=2rg,3=2rM,4=Lng,5=LnM)",
        "1            # of lookahead depth",
        "1            DEPTHs (>=0)",
        "2            SWAP (0=bin-exch,1=long,2=mix)",
        "64           swapping threshold",
        "0            L1 in (0=transposed,1=no-transposed) form",
        "0            U  in (0=transposed,1=no-transposed) form",
        "1            Equilibration (0=no,1=yes)",
        "8            memory alignment in double (> 0)",
        "##### This line (no. 32) is ignored (it serves as a separator). ######",
        "0                       Number of additional problem sizes for PTRANS",
        "1200 10000 30000        values of N",
        "0                       number of additional blocking sizes for PTRANS",
        "40 9 8 13 13 20 16 32 64        values of NB",
    ]
    return "\n".join(lines) + "\n"


def problem_size(mem_mib: int, procs: int, llc_bytes: int) -> int:
    """HPL N for a matrix (8 N^2 bytes, all ranks) of about ``mem_mib`` MiB, but never
    under ``LLC_FACTOR`` x the last-level cache; a multiple of NB x procs."""
    step = NB * procs
    at_most = math.isqrt(mem_mib * 2**20 // 8) // step * step
    at_least = -(-math.isqrt(LLC_FACTOR * llc_bytes // 8) // step) * step
    return max(at_most, at_least, step)


def node_memory_mib(n: int) -> int:
    """Node memory for hpcc at N: 4x the matrix (hpcc's tests, MPI, the OS), 256 MiB steps."""
    need = 4 * 8 * n * n / 2**20
    return max(MIN_NODE_MIB, math.ceil(need / 256) * 256)
