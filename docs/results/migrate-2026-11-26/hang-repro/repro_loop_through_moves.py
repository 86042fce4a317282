"""Reproduce the MPI loop hang after repeated moves (issue 27 item 1)."""
import subprocess, sys, time, json
from pathlib import Path
from hpvc.bench import common
from hpvc.bench.migrate import runner
from hpvc.cluster import lifecycle, ops
from hpvc.cluster.migrate import migrate

MIB = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
MOVES = int(sys.argv[2]) if len(sys.argv) > 2 else 10
SECS = 6
log = print

def guest(store, name, node, cmd, t=30):
    argv = ops.exec_argv(name, node, ["sh", "-c", cmd], store)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=t, check=False)
    return r.stdout + r.stderr

def clocks(store, name):
    for node in ("compute0", "compute1"):
        h0 = time.time()
        out = guest(store, name, node, "date +%s.%N; cat /sys/devices/system/clocksource/clocksource0/current_clocksource")
        h1 = time.time()
        lines = out.split()
        try:
            g = float(lines[0]); log(f"  {node}: guest-host {g - (h0+h1)/2:+.3f} s, clocksource {lines[1]}")
        except Exception:
            log(f"  {node}: {out!r}")

def diag(store, name):
    clocks(store, name)
    for node in ("compute0", "compute1"):
        log(f"--- {node}")
        log(guest(store, name, node, "ps -eo pid,stat,etime,time,wchan:24,args | grep -v '\\[' ; ss -tnpi; dmesg | tail -15"))
    log(subprocess.run(["ps", "-eo", "pid,ppid,stat,etime,args", "--forest"], capture_output=True, text=True).stdout[-4000:])

common.ensure_guest("hpc", log)
with common.scratch_state("repro", log) as (tmp, store):
    files = list(runner._build(tmp))
    name = f"rp{MIB}"
    spec = tmp / f"{name}.toml"
    groups = [{"role": "compute", "count": 2, "memory": f"{MIB}MiB"}]
    spec.write_text(common.cluster_spec(name, common.free_subnets(1)[0], groups, locality="none", kind="vm", image="hpc"))
    lifecycle.up(str(spec), store, log)
    runner._copy_in(name, store, files)
    log((store.cluster_dir(name) / "ranks").read_text() if (store.cluster_dir(name) / "ranks").exists() else "")
    ip = store.get(name).the_plan().node("compute1").ip
    clocks(store, name)
    try:
        for k in range(MOVES):
            p = runner._mpi(name, store, SECS)
            try:
                out, _ = p.communicate(timeout=SECS + 60)
                log(f"move {k}: baseline {out.strip().splitlines()[-1] if out.strip() else out!r} rc={p.returncode}")
            except subprocess.TimeoutExpired:
                log(f"move {k}: BASELINE HUNG")
                diag(store, name)
                runner._stop(p)
                log("ranks file: " + (store.cluster_dir(name) / "ranks").read_text())
                break
            bg = runner._mpi(name, store, SECS)
            time.sleep(min(8, SECS / 2))
            row = runner._move(name, store, ip)
            log(f"move {k}: {row['total_ms']} ms total {row['downtime_ms']} ms down gap {row['ping_gap_ms']}")
            try:
                o, _ = bg.communicate(timeout=SECS + 60)
                log(f"  loop through move: {o.strip().splitlines()[-1] if o.strip() else o!r} rc={bg.returncode}")
            except subprocess.TimeoutExpired:
                log("  LOOP THROUGH MOVE HUNG"); diag(store, name); runner._stop(bg); break
            clocks(store, name)
    finally:
        lifecycle.down(name, store, log)
