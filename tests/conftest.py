"""Shared fixtures for the mxsim test suite."""
