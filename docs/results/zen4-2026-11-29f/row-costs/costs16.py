import json, sys, torch
from specray.kernels.loader import load_model, resolve
from specray.kernels import row_costs
m = load_model(resolve("smollm2-135m"), kernels=sys.argv[1])
cache = m.make_cache(64, 16)
c = row_costs.measure(m, cache, rows=16, context=200, repeats=5)
out = {"kernels": sys.argv[1], "label": sys.argv[2], "seconds": list(c.seconds), "cost": [round(c.cost(r), 3) for r in range(1, 17)]}
print(json.dumps(out))
