"""Canary analysis: PromQL over the gateways' own metrics (pure), and the Prometheus client."""
