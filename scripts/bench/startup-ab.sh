#!/usr/bin/env bash
# Startup of two hpvc checkouts compared, alternated: A (e.g. a clone at the
# commit before a refactor) and B (this checkout), ROUNDS rounds of
# `hpvc bench startup --repeat 1 --no-peer` each, A and B in turn, the order
# swapped every round. Prints min/median/max per side for up/down of each size
# and for the quick commands, and B/A of the medians.
#   usage: scripts/bench/startup-ab.sh A_CHECKOUT [ROUNDS] [OUT]
# HPVC_AB_ARGS adds options to every run (e.g. "--resident").
# Each checkout needs its own .venv (make setup). Run as root.
set -euo pipefail
a=${1:?usage: $0 A_CHECKOUT [ROUNDS] [OUT]}
b=$(cd "$(dirname "$0")/../.." && pwd)
rounds=${2:-5}
out=${3:-$(mktemp -d /tmp/startup-ab.XXXXXX)}
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for side in $order; do
    dir=$a; [ "$side" = B ] && dir=$b
    echo "round $r/$rounds: $side ($dir)" >&2
    # shellcheck disable=SC2086  # HPVC_AB_ARGS is a list of options
    "$dir/.venv/bin/hpvc" bench startup --nodes 1,4,8 --repeat 1 --no-peer \
      ${HPVC_AB_ARGS:-} --out "$out/$side-$r" >/dev/null
  done
done
"$b/.venv/bin/python" - "$out" "$rounds" <<'PY'
import json, re, statistics, sys
from pathlib import Path
out, rounds = Path(sys.argv[1]), int(sys.argv[2])
rows: dict[str, dict[str, list[float]]] = {}
for side in "AB":
    for r in range(1, rounds + 1):
        d = json.loads((out / f"{side}-{r}" / "results.json").read_text())
        for size in d["sizes"]:
            for what in ("up", "down"):
                key = f"{what} {size['nodes']} node(s)"
                rows.setdefault(key, {}).setdefault(side, []).extend(
                    run[f"{what}_s"] for run in size["runs"])
        for c in d["cli"]["commands"]:
            name = re.sub(r"\b[a-z]+\d+n\d+\b", "NAME", c["command"])  # a run's cluster
            rows.setdefault(name, {}).setdefault(side, []).extend(c["runs"])
def mmm(v: list[float]) -> str:
    return f"{min(v):.3f} / {statistics.median(v):.3f} / {max(v):.3f}"
print("| what | A min / median / max s | B min / median / max s | B/A median |")
print("|---|---|---|---|")
for key, sides in rows.items():
    if set(sides) != {"A", "B"}:  # a command only one side's bench times
        print(f"| {key} | {mmm(sides['A']) if 'A' in sides else '-'} |"
              f" {mmm(sides['B']) if 'B' in sides else '-'} | |")
        continue
    a, b = sides["A"], sides["B"]
    print(f"| {key} | {mmm(a)} | {mmm(b)} | {statistics.median(b) / statistics.median(a):.3f} |")
print(f"\nraw: {out}", file=sys.stderr)
PY
