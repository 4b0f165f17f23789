"""The bottom layer: errors and their errnos, crash points for tests, the retry policy.

Imports nothing else of ckptfs.
"""
