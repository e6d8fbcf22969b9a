"""fedstats: federated statistics."""
