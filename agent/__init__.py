"""Praesto node agent: downloads models into the node-local store."""
