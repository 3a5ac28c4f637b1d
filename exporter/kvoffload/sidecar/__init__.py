"""The sidecar next to `vllm serve`: scrape loops, HTTP, its own /metrics, the page."""
