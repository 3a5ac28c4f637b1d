"""vLLM KV cache events: decoding, subscribing, recording and exact CPU-tier sizing."""
