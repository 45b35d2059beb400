"""The shop's migrations."""
