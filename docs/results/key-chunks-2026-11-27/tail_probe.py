"""One fast-kernel projection's cost at 1, 2 and 4 rows for inputs with and without a short last group
(576 = 16 + 2 blocks; 512, 1536 and 640 = 16 + 4 for comparison), the weights streamed from memory
(48 copies of 1.88 MB each, cycled). Run: python docs/results/key-chunks-2026-11-27/tail_probe.py
"""
import time, torch, statistics
from specray.kernels.quant_linear import round_to_q8_0, pack_exact
from specray.kernels.fast_linear import pack_fast, fast_linear
torch.manual_seed(0)
shapes = [(576, 3072), (512, 3456), (1536, 1152), (640, 2764)]
copies = 48
packs = {}
for inf, outf in shapes:
    w = round_to_q8_0(torch.randn(outf, inf) * 0.05)
    base = pack_fast(pack_exact(w))
    packs[(inf, outf)] = [pack_fast(pack_exact(w)) for _ in range(copies)]
xs = {inf: {r: torch.randn(r, inf) for r in (1, 2, 4)} for inf, _ in shapes}
res = {}
for rep in range(5):
    for key, ws in packs.items():
        for r in (1, 2, 4):
            x = xs[key[0]][r]
            t0 = time.perf_counter()
            for fw in ws:
                fast_linear(x, fw)
            dt = (time.perf_counter() - t0) / len(ws) * 1e6
            res.setdefault((key, r), []).append(dt)
for key in packs:
    m = [statistics.median(res[(key, r)]) for r in (1, 2, 4)]
    mb = packs[key][0].nbytes / 1e6
    print(f"in {key[0]:5d} out {key[1]:5d} {mb:.2f} MB: rows 1/2/4 {m[0]:.1f} / {m[1]:.1f} / {m[2]:.1f} us; "
          f"cost(2)/cost(1) {m[1]/m[0]:.3f}, cost(4)/cost(1) {m[2]/m[0]:.3f}; GB/s at 1 row {mb*1e3/m[0]:.1f}")
