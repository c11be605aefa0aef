"""Tests of the example application's external pieces (no database needed)."""
