"""The book's build tooling, kept beside the book and outside the installed library (``papa_lib`` computes and
presents; this folder builds): the chapters and their ``.ipynb`` twins (:mod:`papa_book.chapters`), the Jupyter
Book build and the papermill profile runs (:mod:`papa_book.build`), the Sphinx extension named in ``_config.yml``
(:mod:`papa_book.sphinx_hooks`: offline vega bundle and MathJax, honest re-execution), the execution fingerprint
(:mod:`papa_book.execution`), the page checks (:mod:`papa_book.page_check`) and the inlined Colab badge
(:mod:`papa_book.offline_badge`).

``papa book`` and ``papa reproduce`` import it from ``book/_ext`` of the checkout they run in;
``python -m papa_book sync|check|build|badge|run`` (with ``book/_ext`` on ``PYTHONPATH``) drives it directly.
"""

from .build import (  # noqa: F401
    BookBuildError,
    ChapterExecutionError,
    build_book,
    failure_line,
    run_chapters,
)
from .chapters import check_notebooks, colab_badge, colab_url, sync_notebooks  # noqa: F401
from .sphinx_hooks import setup  # noqa: F401
