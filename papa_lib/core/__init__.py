"""The core seam (paper Sec. 3, App. A): encoders and their adapters, the fixed-position layout, pad-free packing,
pad-aware averaging of attention matrices and the one override through which every head is replaced; decoder LMs
(:mod:`papa_lib.core.decoders`: the packaged Gemma 3 270M, causal adapters, the decoder layout, a chunked LM loss)
go through the same seam.

Nothing here imports from :mod:`papa_lib.experiments`, :mod:`papa_lib.analysis` or :mod:`papa_lib.book`.
"""
