"""The long-context pool: waking it, marking its activity; and the KV-cache probe."""
