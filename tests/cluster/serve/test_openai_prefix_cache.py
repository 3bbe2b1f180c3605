"""The prefix cache over the HTTP API: usage and the metrics count the prompt tokens it found, and a
cache salt keeps hits within the requests that share it."""

import httpx

from openai_helpers import client, served  # noqa: F401 - fixtures


def test_usage_and_metrics_count_the_prompt_tokens_found_in_the_prefix_cache(client, served):
    def scrape():
        lines = httpx.get(served[0].url + "/metrics").text.splitlines()
        return {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in lines if ln and not ln.startswith("#")}

    prompt = " ".join(f"w{30 + i % 40}" for i in range(45))  # a prompt no other test sends
    before = scrape()
    first, second = (client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=6,
                                               extra_body={"ignore_eos": True}) for _ in range(2))
    after = scrape()
    assert first.usage.prompt_tokens_details.cached_tokens == 0 and first.choices[0].text == second.choices[0].text
    cached = second.usage.prompt_tokens_details.cached_tokens  # whole blocks of 16, never the last token
    assert cached == (second.usage.prompt_tokens - 1) // 16 * 16 > 0
    assert after["specray_prefix_cache_hits_total"] - before["specray_prefix_cache_hits_total"] == cached
    assert after["specray_prefix_cache_queries_total"] - before["specray_prefix_cache_queries_total"] == \
        2 * second.usage.prompt_tokens


def test_a_cache_salt_keeps_prefix_cache_hits_within_the_salt(client):
    prompt = " ".join(f"w{50 + i % 30}" for i in range(45))  # a prompt no other test sends

    def cached(salt=None):
        out = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=2,
                                        extra_body={"cache_salt": salt} if salt else None)
        return out.usage.prompt_tokens_details.cached_tokens

    assert [cached("tenant-1"), cached(), cached("tenant-2"), cached("tenant-1"), cached()] == [0, 0, 0, 32, 32]
