"""Shared machinery of the federated algorithms: the bases, pure aggregation functions, server
optimizers, clustering, per-client state, staleness tracking and epsilon schedules."""
