"""Skill evolution: skills and their lineage, proposers, the paired held-out gate, the overnight loop."""
