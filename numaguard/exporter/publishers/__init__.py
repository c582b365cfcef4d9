"""What the exporter writes, apart from its metrics: objects it publishes to the API
server from the cycle's snapshot (``--nrt``). Sources read; publishers write."""
