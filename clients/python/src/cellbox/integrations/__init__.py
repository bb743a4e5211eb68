"""Integrations with agent libraries: `cellbox.integrations.rlm` (an rlms
environment) and `cellbox.integrations.smolagents` (a CodeAgent executor).
Each imports its library only when used."""
