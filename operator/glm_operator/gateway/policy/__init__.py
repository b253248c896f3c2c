"""Policy: API keys, rate limits and their shared store, audit, metrics, accounting."""
