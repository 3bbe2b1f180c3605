"""CPU seconds per thread of some processes between two calls: `save PID...`, then `diff PID...` (docs/performance.md, 2026-11-29 night)."""
import os, sys, json
def snap(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            s = open(f"/proc/{pid}/task/{tid}/stat").read()
            name = s[s.index("(")+1:s.rindex(")")]
            f = s[s.rindex(")")+2:].split()
            out[tid] = (name, int(f[11]) + int(f[12]))
        except OSError: pass
    return out
if __name__ == "__main__":
    pids = sys.argv[2:]
    if sys.argv[1] == "save":
        json.dump({p: snap(p) for p in pids}, open("/tmp/thread_cpu.json", "w"))
    else:
        old = json.load(open("/tmp/thread_cpu.json"))
        for p in pids:
            new = snap(p); rows = []
            for tid, (name, t) in new.items():
                d = t - old.get(p, {}).get(tid, [name, 0])[1]
                if d > 0: rows.append((d, tid, name))
            print(p, "total", sum(r[0] for r in rows) / 100, "s")
            for d, tid, name in sorted(rows, reverse=True)[:8]: print("  ", d / 100, tid, name)
