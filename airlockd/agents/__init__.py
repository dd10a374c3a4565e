"""Adapters that turn (agent, prompt) into a container command."""
