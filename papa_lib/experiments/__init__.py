"""Experiments (paper Sec. 4, 5; App. B): tasks and metrics, probes, head selection, the results store and the
engine that runs declared grids. Built on :mod:`papa_lib.core`; knows nothing of the analyses or the book.
"""
