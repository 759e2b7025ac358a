"""The scalar decays' folder: a constant gamma per head, or log-gates per token."""
