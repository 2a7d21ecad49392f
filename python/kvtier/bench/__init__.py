"""Benchmarks that drive real engines with kvtier: compare_vllm (kvtier against vLLM's own
offloading and LMCache, `scripts/compare-vllm`), and the helpers they share with the tests."""
