"""Collectors: a NodeSnapshot -> metric families. Thin: every value is already in the
snapshot; a collector only names it."""
