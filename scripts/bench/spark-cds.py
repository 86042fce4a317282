#!/usr/bin/env python3
"""How long the Spark daemons of the `spark` image take to come up, started the
two ways hpvc has started them, alternated:

- spark-class: Spark's own script (a launcher JVM builds the command, then the
  daemon's JVM loads every class from the jars): hpvc before 2026-11-27, and
  still for images without archives;
- direct: the daemon's JVM started directly with the explicit class path, no
  archive (what the launcher alone costs);
- cds: the same with the class-data archive the image build recorded
  (hpvc.spark.cds): hpvc since 2026-11-27.

Each round starts a master, waits for it to lead, starts a worker and waits
for it to register; the times are from each daemon's start. Both run in the
image's root (an overlay over it in a private mount namespace: the image is
not written), on the host's loopback. Natively, not in a guest.
  usage: .venv/bin/python scripts/bench/spark-cds.py [ROUNDS] [OUT]
Run as root, from the checkout (the `spark` image must be built).
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hpvc.image import resolve_image
from hpvc.spark import cds, model
from hpvc.spec import spark as sizing


def _argv(mode: str, root: Path, role: str, args: list[str]) -> str:
    env = {"SPARK_HOME": model.IMAGE_SPARK_HOME, "JAVA_HOME": model.IMAGE_JAVA_HOME,
           "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOCAL_HOSTNAME": "localhost",
           "SPARK_DAEMON_MEMORY": f"{sizing.DAEMON_MEMORY_MIB}m",
           "SPARK_DAEMON_JAVA_OPTS": model.DAEMON_JAVA_OPTS}  # fmt: skip
    cls = cds.MASTER if role == "master" else cds.WORKER
    if mode in ("cds", "direct"):
        env |= cds.daemon_env(root)
        argv = cds.daemon_argv(cds.classpath(root), sizing.DAEMON_MEMORY_MIB, cls, args,
                               cds.archive(role) if mode == "cds" else None)  # fmt: skip
    else:
        argv = [f"{model.IMAGE_SPARK_HOME}/bin/spark-class", cls, *args]
    return " ".join(["env", *(shlex.quote(f"{k}={v}") for k, v in env.items()),
                     *map(shlex.quote, argv)])  # fmt: skip


def _round(mode: str, root: Path) -> str:
    """Shell (in the image's root): one master and one worker, their times on stdout."""
    master = _argv(mode, root, "master", ["--host", "127.0.0.1", "--port", "0",
                                          "--webui-port", "0"])  # fmt: skip
    worker = _argv(mode, root, "worker", ["--host", "127.0.0.1", "--port", "0",
                                          "--webui-port", "0", "--cores", "1", "--memory",
                                          "256M", "--work-dir", "/tmp/w"])  # fmt: skip
    return f"""
set -u
now() {{ date +%s.%N; }}
wait_for() {{ while ! grep -q "$2" "$1"; do sleep 0.02; done; }}
rm -rf /tmp/m.log /tmp/w.log /tmp/w; mkdir -p /tmp/w
t0=$(now); {master} >/tmp/m.log 2>&1 & m=$!
wait_for /tmp/m.log 'Starting Spark master at spark://'
wait_for /tmp/m.log 'I have been elected leader'
t1=$(now)
url=$(sed -n 's|.*Starting Spark master at \\(spark://[^ ]*\\).*|\\1|p' /tmp/m.log)
t2=$(now); {worker} "$url" >/tmp/w.log 2>&1 & w=$!
wait_for /tmp/w.log 'Successfully registered with master'
t3=$(now)
kill -TERM $w $m; wait
echo "$t0 $t1 $t2 $t3"
"""


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    root = resolve_image("spark").rootfs
    if not (root / cds.archive("master").lstrip("/")).is_file():
        print("the spark image has no class-data archives: hpvc image build spark", file=sys.stderr)
        return 2
    modes = ("spark-class", "direct", "cds")
    samples: dict[str, dict[str, list[float]]] = {m: {"master": [], "worker": []}
                                                  for m in modes}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="hpvc-spark-cds-") as tmp:
        t = Path(tmp)
        for d in ("upper", "work", "merged"):
            (t / d).mkdir()
        for r in range(rounds):
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            for mode in order:
                (t / "upper" / "round.sh").write_text(_round(mode, root))
                mount = (f"mount -t overlay overlay -o lowerdir={root},upperdir={t}/upper,"
                         f"workdir={t}/work {t}/merged && mount -t proc proc {t}/merged/proc"
                         f" && exec chroot {t}/merged /bin/sh /round.sh")  # fmt: skip
                done = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--kill-child",
                                       "sh", "-c", mount], capture_output=True, text=True,
                                      check=True, timeout=300)  # fmt: skip
                t0, t1, t2, t3 = map(float, done.stdout.split()[-4:])
                m, w = t1 - t0, t3 - t2
                samples[mode]["master"].append(m)
                samples[mode]["worker"].append(w)
                print(f"round {r + 1} {mode}: master {m:.2f} s, worker {w:.2f} s", flush=True)
    for role in ("master", "worker"):
        for mode in modes:
            s = samples[mode][role]
            print(f"{role} {mode}: min/median/max {min(s):.2f} / {statistics.median(s):.2f}"
                  f" / {max(s):.2f} s")  # fmt: skip
        base = statistics.median(samples["spark-class"][role])
        for mode in modes[1:]:
            ratio = statistics.median(samples[mode][role]) / base
            print(f"{role}: {mode} / spark-class at the medians {ratio:.2f}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"rounds": rounds, "samples": samples},
                                                     indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
