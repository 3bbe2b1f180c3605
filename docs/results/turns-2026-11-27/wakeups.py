"""Voluntary and involuntary context switches a second of every process (all its threads) over a
window: how often each idle process wakes (docs/performance.md, 2026-11-27 afternoon).

    python wakeups.py 15
"""
import os
import sys
import time


def snap():
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:70] or pid
            tot = 0
            for tid in os.listdir(f"/proc/{pid}/task"):
                for line in open(f"/proc/{pid}/task/{tid}/status"):
                    if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")):
                        tot += int(line.split()[1])
            out[pid] = (tot, cmd)
        except OSError:
            pass
    return out
s = float(sys.argv[1]) if len(sys.argv) > 1 else 10
a = snap(); time.sleep(s); b = snap()
rows = sorted(((b[p][0] - a[p][0]) / s, p, b[p][1]) for p in b if p in a)[::-1]
for r, p, c in rows[:16]:
    print(f"{r:8.1f}/s {p:>7} {c}")
print("total", round(sum(r[0] for r in rows), 1), "/s")
