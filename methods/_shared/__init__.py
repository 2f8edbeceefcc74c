"""Algorithms shared by several methods, written as pure functions with their own unit tests."""
