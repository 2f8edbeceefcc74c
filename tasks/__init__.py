"""Declarative task definitions: domains, end tasks and domain sequences of the DAS paper (YAML)."""
