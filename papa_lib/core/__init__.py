"""The core seam (paper Sec. 3, App. A): encoders and their adapters, the fixed-position layout, pad-free packing,
pad-aware averaging of attention matrices and the one override through which every head is replaced.

Nothing here imports from :mod:`papa_lib.experiments`, :mod:`papa_lib.analysis` or :mod:`papa_lib.book`.
"""
