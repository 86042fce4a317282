"""Many moves of compute1 under TX traffic; watch for the virtio-net ring break."""
import subprocess, sys, time, glob
from pathlib import Path
from hpvc.bench import common
from hpvc.bench.migrate import runner
from hpvc.cluster import lifecycle, ops
from hpvc.cluster.migrate import migrate
from hpvc.backends.vm.migration import MigrationSettings

MOVES = int(sys.argv[1]); MULTIFD = [int(x) for x in sys.argv[2].split(",")]; HOG = int(sys.argv[3])
log = lambda *a: print(*a, flush=True)
hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(HOG)]
common.ensure_guest("hpc", log)
try:
  with common.scratch_state("ring", log) as (tmp, store):
    files = list(runner._build(tmp))
    name = "ring1"
    spec = tmp / f"{name}.toml"
    groups = [{"role": "compute", "count": 2, "memory": "256MiB"}]
    spec.write_text(common.cluster_spec(name, common.free_subnets(1)[0], groups, locality="none", kind="vm", image="hpc"))
    lifecycle.up(str(spec), store, log)
    runner._copy_in(name, store, files)
    plan = store.get(name).the_plan()
    ip1 = plan.node("compute1").ip
    cons = [p for p in glob.glob(str(store.root) + "/**/console.log", recursive=True) if "compute1" in p]
    log("console", cons)
    try:
        for k in range(MOVES):
            mf = MULTIFD[k % len(MULTIFD)]
            fl = subprocess.Popen(ops.exec_argv(name, "compute0", ["sh", "-c", f"ping -q -i 0.01 -w 8 {ip1}"], store), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            mw = subprocess.Popen(ops.exec_argv(name, "compute1", ["/root/memwrite", "32", "6"], store), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            time.sleep(2)
            out = migrate(name, "compute1", settings=MigrationSettings(multifd=mf), store=store)
            m = out["migration"]
            o, _ = mw.communicate(timeout=120); f, _ = fl.communicate(timeout=120)
            text = "".join(Path(c).read_text(errors="replace") for c in cons)
            bad = "not a head" in text or "soft lockup" in text
            log(f"move {k} multifd={mf}: total {m.get('total_ms')} down {m.get('downtime_ms')} ping={out.get('answers_ping')} memwrite rc={mw.returncode} {o.strip()[-60:]!r} flood rc={fl.returncode} {f.strip().splitlines()[-2:] if f else ''} BAD={bad}")
            if bad or mw.returncode != 0:
                log(text[-3000:]); break
    finally:
        lifecycle.down(name, store, log)
finally:
    for h in hogs: h.kill(); h.wait()
