"""The bottom layer: the configuration, errors and their errnos, units, the retry policy,
crash points for tests.

Imports nothing else of ckptfs.
"""
