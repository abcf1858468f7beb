"""Shared building blocks of the plugin's models."""
