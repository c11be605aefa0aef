"""Integrations with other frameworks, each importing its framework only when imported
itself (``import rota`` never needs them)."""
