"""What a server costs its node while idle: CPU seconds each process on this machine takes over a
window, read from /proc (the busiest first), and their total as a share of the node's cores.

    specray serve &                     # wait until it answers, then
    python benchmarks/idle_cpu.py --seconds 20

On a small node every idle process's wake-ups preempt the target's kernel threads while it serves
(docs/performance.md); this measures them without sampling (no py-spy) and without load.
"""

from __future__ import annotations

import argparse
import os
import time

HZ = os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> dict[int, tuple[float, str]]:
    """pid -> (user + system CPU seconds so far, command line or name)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline") as f:
                cmd = f.read().replace("\0", " ").strip()
        except OSError:  # the process ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the name, which may hold spaces
        out[int(pid)] = ((int(fields[11]) + int(fields[12])) / HZ, cmd or stat.split("(", 1)[1].split(")")[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="the window")
    ap.add_argument("--top", type=int, default=12, help="processes listed")
    args = ap.parse_args()
    before = cpu_seconds()
    time.sleep(args.seconds)
    after = cpu_seconds()
    rows = sorted(((after[p][0] - before[p][0], p, after[p][1]) for p in after if p in before), reverse=True)
    for used, pid, cmd in rows[:args.top]:
        if used > 0:
            print(f"{used:6.2f} s  {pid:>7}  {cmd[:100]}")
    total, cores = sum(r[0] for r in rows), os.cpu_count() or 1
    print(f"total {total:.2f} CPU s over {args.seconds:.0f} s: {100 * total / (cores * args.seconds):.1f} % of {cores} cores")


if __name__ == "__main__":
    main()
