"""Analyses beyond probing: norm-based attention (Kobayashi et al. 2020), attention patterns and input variability
(Sec. 5.1), masked-language-model probing (Sec. 5.5). Built on :mod:`papa_lib.core` and :mod:`papa_lib.experiments`.
"""
