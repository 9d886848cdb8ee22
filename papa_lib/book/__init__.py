"""The book layer: one call per figure or table, offline charts, run profiles, the paper's numbers, the chapters'
pages (``<chapter>_pages`` / ``*_figures`` modules: every figure, table and generated sentence a chapter shows, so
that chapters hold no plotting or bookkeeping code), what records say about themselves
(:mod:`papa_lib.book.records`) and the build.

``papa_lib.book`` is also the Sphinx extension named in ``_config.yml`` (:func:`setup`), and
``python -m papa_lib.book sync|check|build|badge|run`` drives the build (:mod:`papa_lib.book.build`).
"""

from .build import (  # noqa: F401
    BookBuildError,
    ChapterExecutionError,
    build_book,
    check_notebooks,
    colab_badge,
    colab_url,
    find_repo_root,
    run_chapters,
    sync_notebooks,
)
from .sphinx_hooks import setup  # noqa: F401
