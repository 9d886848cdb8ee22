"""The book's shared presentation layer: what several chapters use, and nothing a single chapter owns.

- :mod:`~papa_lib.book.profiles`   run profiles (smoke, local, paper): model, data and results folder of a chapter
- :mod:`~papa_lib.book.provenance` the banner at the top of every chapter: where its numbers come from
- :mod:`~papa_lib.book.charts`     the chart theme and offline rendering (altair, no CDN)
- :mod:`~papa_lib.book.tables`     the table formatter (readable names, three significant figures)
- :mod:`~papa_lib.book.display`    a sentence a cell builds, shown as Markdown in every mode
- :mod:`~papa_lib.book.records`, :mod:`~papa_lib.book.figures`, :mod:`~papa_lib.book.grid_views`
                                   the results views: tidy frames of the records for figures and tables

Each chapter builds its own figures, tables and sentences from these. The book's build tooling (Sphinx extension,
``.ipynb`` sync, page checks) lives beside the book in ``book/_ext/papa_book``, not in the installed library.
"""
