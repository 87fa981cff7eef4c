"""The operator's tools: what the policies did (observe, charts, metrics), resetting a
client, and replaying an access log against the policies."""
