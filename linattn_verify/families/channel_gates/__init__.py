"""Channel gates' folder: a log-gate per token and key channel (GLA)."""
