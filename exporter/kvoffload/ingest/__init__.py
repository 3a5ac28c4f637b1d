"""Reading vLLM: scraping /metrics, parsing, the metric catalog, recordings."""
