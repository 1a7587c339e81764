"""Admission webhooks: mutate Pods, validate ModelCaches."""
