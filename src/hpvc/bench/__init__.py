"""Benchmarks: each writes results.json (every sample) and a report.

One folder per suite: ``hpcc``, ``isolation``, ``io``, ``network``, ``slurm``,
``spark``, ``coordinator``, ``startup``, ``locality``, ``planning``. In each,
``runner.py`` measures (brings clusters up, runs the tools) and the other
modules are its pure parts (configurations, parsers, statistics, the
document and report.md). A suite imports its own folder and this top level,
never another suite's runner; ``isolation`` reuses ``hpcc``'s pure input and
parser, as its workload is one hpcc run.

What more than one suite uses stays here at the top, not in a folder of its
own, so that the rule reads "a folder is a suite": ``common`` (checks, host
facts, a throw-away state, output), ``stats`` and ``ratios`` (summaries and
paired ratios of any suite's samples), and ``hpvc bench run`` across the
suites: ``harness`` (plans and runs them), ``report`` (goals, report.md,
compare) and ``plots``.
"""
